"""``python3 -m ubep.bench`` under mpirun: one rank per process, the group from the mpi4py
communicator (``ubep.make_group(MPI.COMM_WORLD)``: shared memory within a host, the relay over
MPI between hosts), ``--topology HxR`` for H hosts of R ranks.

    mpirun -np 4 --mca btl tcp,self python3 -m ubep.bench --topology 2x2 --workload decode

When the processes share one machine and H > 1, the hosts are forced (``ranks_per_host=R``), so
the relay runs over MPI -- TCP with ``--mca btl tcp,self``, as between real hosts; on real
hosts the ones MPI finds must match H. Impls: ``ubep``/``bsp`` (Python calls), ``mpi`` (the C++
``AlltoallBaseline``: pack, MPI_Alltoall of counts, MPI_Alltoallv of rows, unpack; timed in
C++), ``torch`` (gloo ``all_to_all_single`` over the same processes; gloo knows no hosts, its
TCP runs between every pair) and ``deep_ep``. After timing, ubep's results are compared bit
for bit with the baseline's on the same group and, with forced hosts, with a one-host group of
the same processes.
"""
import json
import os
import socket
import sys

import numpy as np

from . import _bench_run as bench


def under_mpirun():
    """Whether this process was started by mpirun (Open MPI, MPICH/Hydra or PMIx launchers)."""
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def parse_topology(text, size):
    """"HxR" -> (H, R), which must cover the ``size`` processes mpirun started."""
    try:
        h, r = (int(v) for v in text.lower().split("x"))
    except ValueError:
        sys.exit(f"--topology {text!r}: expected HxR (hosts x ranks per host), e.g. 2x2")
    if h < 1 or r < 1 or h * r != size:
        sys.exit(f"--topology {text}: {h} hosts x {r} ranks = {h * r} ranks, but mpirun "
                 f"started {size} processes (mpirun -np {max(h, 1) * max(r, 1)})")
    return h, r


def _torch_dist(comm, rank, size, names):
    """torch.distributed (gloo) over the same processes, for the torch path: rank 0's address
    and a free port, broadcast over MPI."""
    import torch.distributed as dist
    local = len(set(names)) == 1
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1" if local else "", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    if local:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: never depend on DNS
    dist.init_process_group("gloo", init_method=f"tcp://{'127.0.0.1' if local else names[0]}:"
                            f"{port}", rank=rank, world_size=size)
    return dist


def main_mpi(args):
    if not under_mpirun():
        sys.exit("--topology runs under mpirun, one rank per process: mpirun -np N [--mca btl "
                 "tcp,self] python3 -m ubep.bench --topology HxR")
    from mpi4py import MPI
    import torch

    import ubep
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    h, r = parse_topology(args.topology or f"1x{size}", size)
    args.workloads = list(bench.WORKLOADS) if args.workload == "all" else \
        args.workload.split(",")
    for name in args.workloads:
        if name not in bench.WORKLOADS:
            sys.exit(f"unknown workload '{name}' (expected decode, prefill, tiny or all)")
    args.algo = args.algo or "ubep,bsp,mpi,torch"
    bench.check_args(args)
    names = comm.allgather(socket.gethostname())
    found = len(set(names))
    if found == h:
        rph, how = 0, "found by MPI"
    elif found == 1:
        rph, how = r, "forced (ranks_per_host), one machine"
    else:
        sys.exit(f"--topology {h}x{r}: mpirun placed the ranks on {found} hosts "
                 f"({', '.join(sorted(set(names)))}), not {h}")
    group = ubep.make_group(comm, ranks_per_host=rph)
    dist = _torch_dist(comm, rank, size, names) if "torch" in args.algo.split(",") else None

    def slowest(times):
        return np.max(np.array(comm.allgather([float(t) for t in times])), axis=0)

    ctx = bench.Ctx(rank, size, group, slowest, lambda n: comm.allreduce(int(n)), dist,
                    f"mpirun {size} processes, {h} hosts x {r} ranks ({how}), "
                    f"make_group(MPI.COMM_WORLD)", comm=comm, topology=f"{h}x{r}")
    report = bench.run_rank(ctx, args)
    report["ubep_bench"] = []
    if rank == 0:
        bench.print_report(report)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(config=report["configs"], results=report["results"],
                               binding=report["binding"], identity=report.get("identity", [])),
                          f, indent=1)
    if dist is not None:
        dist.destroy_process_group()
