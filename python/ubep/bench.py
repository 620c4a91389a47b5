"""python3 -m ubep.bench: ubep from Python beside the torch.distributed path users write today,
and beside the same calls timed in C++ (the binding's overhead).

On ``--ranks`` local processes (torch.multiprocessing, gloo for set-up), per workload:

* ``ubep`` / ``bsp``: ubep.Buffer.dispatch (latency or throughput layout) and combine, called
  from Python (results as torch views; the identity expert copies the received rows into the
  zero-copy combine buffer, untimed, as ubep-bench does);
* ``deep_ep``: the same calls through ``ubep.deep_ep`` (DeepEP's API: tuple handles, int32
  counts, a new combined tensor each call; compact placement, as DeepEP's packing);
  ``deep_ep_fp8``: its low-latency calls with DeepEP's default ``use_fp8=True`` (x cast to
  e4m3 on send; decode and tiny only);
* ``torch``: permute (token, expert) rows by destination, ``all_to_all_single`` of counts, of
  rows (bf16 bytes as float16: gloo has no bf16) and of expert ids over gloo, un-permute by
  expert; back: re-permute,
  ``all_to_all_single``, weighted ``index_add_`` in fp32, cast;
* ``oneccl``: ubep's C++ all-to-all baseline (pack, all-to-all of counts, all-to-all-v of
  rows, unpack; combine mirrored, fixed-order fp32 reduce) over oneCCL's ``alltoallv``, timed in
  C++; only in an extension built with ``-DUBEP_ONECCL_ROOT`` (docs/INTEGRATIONS.md). ``mpi``
  (under mpirun) is the same baseline over ``MPI_Alltoallv``. After timing, ubep's combine
  output is compared with each baseline's bit for bit (``identity`` in the JSON);
* the same ubep calls in a C++ loop inside the extension (``cpp``), and, when found, the
  ``ubep-bench`` binary on the same shape (``--ubep-bench PATH``; mpirun if available).

Each timed call starts after an untimed ubep group barrier (``--no-barrier``: back to back, as
ubep-bench), so the untimed work between calls (the identity expert, Python bookkeeping) does
not show up as one rank waiting for the other. Times are per iteration the slowest rank's; median and p99 over iterations; GB/s = bytes
received per rank / median. ``--json FILE`` writes ubep-bench's schema
``{"config", "results": [{"impl", "op", "median_us", "p99_us", "gbps"}]}`` plus
``"binding"``: per algorithm and op, Python vs C++ median and the difference.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

from . import _bench_hosts
from ._bench_run import WORKLOADS, check_args, print_report, rank_main


def parse(argv=None):
    p = argparse.ArgumentParser(
        prog="python3 -m ubep.bench",
        description="ubep from Python vs the torch.distributed gloo all_to_all path and vs the "
                    "same calls timed in C++ (the binding's overhead), on local processes.")
    p.add_argument("--workload", default="decode", help="decode | prefill | tiny | all")
    p.add_argument("--ranks", type=int, default=2, help="local processes (default 2)")
    p.add_argument("--algo", default=None,
                   help="comma list of ubep,bsp,deep_ep,deep_ep_fp8,torch,mpi,oneccl "
                        "(deep_ep_fp8: DeepEP's default use_fp8=True; mpi: the C++ "
                        "MPI_Alltoallv baseline, under mpirun; oneccl: the same baseline over "
                        "oneCCL's alltoallv, in an extension built with -DUBEP_ONECCL_ROOT; "
                        "default ubep,bsp,torch, and mpi under mpirun)")
    p.add_argument("--topology", default=None,
                   help="HxR under mpirun: H hosts of R ranks each (forced hosts when the "
                        "processes share a machine: shared memory within, MPI between)")
    p.add_argument("--iters", type=int, default=None, help="measured iterations (per workload "
                   "default: decode 50, prefill 10, tiny 500)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up iterations")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens per rank instead of the workload's (decode 128, prefill 4096, "
                        "tiny 1); its layout stays")
    p.add_argument("--seed", type=int, default=1, help="routing and data seed")
    p.add_argument("--placement", default="auto",
                   help="auto (as ubep-bench: per-source for latency) | compact | per-source")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--ubep-bench", default=None, help="ubep-bench binary for the C++ figure")
    p.add_argument("--no-ubep-bench", action="store_true", help="skip the ubep-bench run")
    p.add_argument("--no-barrier", action="store_true",
                   help="time calls back to back (as ubep-bench) instead of starting each timed "
                        "call after an untimed group barrier")
    return p.parse_args(argv)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_ubep_bench(arg):
    if arg:
        return arg
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.environ.get("UBEP_BENCH", ""),
                 os.path.join(here, "..", "..", "tools", "ubep-bench")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.normpath(cand)
    return shutil.which("ubep-bench")


def run_ubep_bench(path, workload, ranks, algos, iters, warmup, placement, tokens=None):
    """The C++ benchmark on the same shape: process ranks under mpirun when available."""
    algos = ",".join(a for a in algos if a in ("ubep", "bsp")) or "ubep"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "b.json")
        cmd = [path, "--workload", workload, "--algo", algos, "--json", out, "--quiet",
               "--placement", placement]
        if tokens:
            cmd += ["--tokens", str(tokens)]
        if iters:
            cmd += ["--iters", str(iters)]
        if warmup is not None:
            cmd += ["--warmup", str(warmup)]
        mpirun = shutil.which("mpirun")
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        cmd = ([mpirun, "-np", str(ranks)] + cmd) if mpirun else (cmd + ["--ranks", str(ranks)])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0 or not os.path.exists(out):
            return None, " ".join(cmd), proc.stderr[-400:]
        with open(out) as f:
            return json.load(f), " ".join(cmd), ""


def main(argv=None):
    args = parse(argv)
    if args.topology is not None or _bench_hosts.under_mpirun():
        return _bench_hosts.main_mpi(args)
    args.algo = args.algo or "ubep,bsp,torch"
    check_args(args)
    args.workloads = list(WORKLOADS) if args.workload == "all" else args.workload.split(",")
    for w in args.workloads:
        if w not in WORKLOADS:
            sys.exit(f"unknown workload '{w}' (expected decode, prefill, tiny or all)")
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        mp.spawn(rank_main, args=(args.ranks, free_port(), args, out), nprocs=args.ranks)
        with open(out) as f:
            report = json.load(f)
    algos = args.algo.split(",")
    report["ubep_bench"] = []
    exe = None if args.no_ubep_bench else find_ubep_bench(args.ubep_bench)
    for name in args.workloads:
        if not exe:
            break
        res, cmd, err = run_ubep_bench(exe, name, args.ranks, algos, args.iters, args.warmup,
                                       args.placement, args.tokens)
        entry = dict(workload=name, command=cmd)
        if res:
            entry["results"] = [r for r in res["results"] if r["impl"] in ("ubep", "bsp")]
        else:
            entry["error"] = err
        report["ubep_bench"].append(entry)
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(config=report["configs"][0] if len(report["configs"]) == 1 else
                           report["configs"], results=report["results"],
                           binding=report["binding"], identity=report.get("identity", []),
                           ubep_bench=report["ubep_bench"]), f,
                      indent=1)


if __name__ == "__main__":
    main()
