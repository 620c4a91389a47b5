"""The per-rank part of ``python3 -m ubep.bench`` (see bench.py): the workloads, each
implementation's timing loop, the report, and the bit-identity check under mpirun. Used by
bench.py (local processes) and _bench_hosts.py (mpirun); imports neither.
"""
import json
import os

import numpy as np

WORKLOADS = {  # as ubep-bench: hidden 7168, top-8 of 256 experts, bf16
    "decode": dict(tokens=128, layout="latency", iters=50, warmup=5),
    "prefill": dict(tokens=4096, layout="throughput", iters=10, warmup=2),
    "tiny": dict(tokens=1, layout="latency", iters=500, warmup=50),
}


def check_args(args):
    """Exits naming the reason for a token count or an implementation this process cannot run
    (before any rank starts, so the message is not one of N tracebacks)."""
    import sys

    from . import _ubep
    if args.tokens is not None and args.tokens < 1:
        sys.exit(f"--tokens {args.tokens}: must be >= 1")
    algos = [a for a in args.algo.split(",") if a]
    unknown = [a for a in algos
               if a not in ("ubep", "bsp", "deep_ep", "deep_ep_fp8", "torch", "mpi", "oneccl")]
    if unknown:
        sys.exit(f"--algo: unknown {','.join(unknown)} (expected ubep, bsp, deep_ep, deep_ep_fp8, "
                 "torch, mpi, oneccl)")
    if "oneccl" in algos and not _ubep.has_oneccl:
        sys.exit("--algo oneccl: this ubep extension was built without oneCCL (configure with "
                 "-DUBEP_ONECCL_ROOT=<prefix of oneccl-cpu-devel>, e.g. the venv of "
                 "scripts/venv.sh --oneccl; docs/INTEGRATIONS.md)")


def routing(rng, tokens, topk, experts):
    idx = np.stack([rng.choice(experts, size=topk, replace=False) for _ in range(tokens)])
    return idx.astype(np.int64).reshape(tokens, topk), rng.uniform(
        0.05, 1.0, size=(tokens, topk)).astype(np.float32)


def slowest(dist, times):
    """Per iteration, the slowest rank's time (all_gather over gloo, outside the timed part)."""
    import torch
    t = torch.tensor(times, dtype=torch.float64)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out).max(dim=0).values.numpy()


def total(dist, n):
    """An int summed over ranks (gloo)."""
    import torch
    t = torch.tensor([n], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())


def summary(per_iter, bytes_per_rank):
    med = float(np.median(per_iter))
    p99 = float(np.sort(per_iter)[min(len(per_iter) - 1, int(np.ceil(0.99 * len(per_iter))) - 1)])
    return dict(median_us=med, p99_us=p99, gbps=bytes_per_rank / (med * 1e3) if med else 0.0,
                bytes_per_rank=bytes_per_rank)


def torch_path(dist, x, idx, w, ranks, experts):
    """The gloo path, as two closures (dispatch, combine) sharing state."""
    import torch
    El = experts // ranks
    state = {}

    def wire(t):  # gloo (torch 1.13) has no bf16 or int16 all_to_all: same bytes as float16
        return t.view(torch.float16) if t.dtype == torch.bfloat16 else t

    def dispatch():
        valid = idx >= 0
        tok = torch.arange(idx.shape[0]).unsqueeze(1).expand_as(idx)[valid]
        exp = idx[valid]
        order = torch.argsort(exp, stable=True)  # by expert, hence by destination rank
        tok, exp = tok[order], exp[order]
        send_counts = torch.bincount(exp // El, minlength=ranks)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        s, r = send_counts.tolist(), recv_counts.tolist()
        rows = x.index_select(0, tok)
        recv_rows = x.new_empty((sum(r), x.shape[1]))
        dist.all_to_all_single(wire(recv_rows), wire(rows), r, s)
        recv_exp = exp.new_empty(sum(r))
        dist.all_to_all_single(recv_exp, exp, r, s)
        perm = torch.argsort(recv_exp, stable=True)  # group by local expert (for the GEMMs)
        state.update(tok=tok, w=w[valid][order], s=s, r=r, perm=perm)
        return recv_rows.index_select(0, perm), torch.bincount(recv_exp % El, minlength=El)

    def combine(expert_out):
        back = torch.empty_like(expert_out)
        back[state["perm"]] = expert_out  # un-permute to the received order
        rows = expert_out.new_empty((sum(state["s"]), expert_out.shape[1]))
        dist.all_to_all_single(wire(rows), wire(back), state["s"], state["r"])
        y = torch.zeros((x.shape[0], x.shape[1]), dtype=torch.float32)
        y.index_add_(0, state["tok"], rows.float() * state["w"].unsqueeze(1))
        return y.to(x.dtype)

    return dispatch, combine


def deep_ep_path(group, x, idx, w, T, E, latency, warmup, iters, sync, fp8=False):
    """ubep.deep_ep's dispatch and combine (DeepEP's calls), the identity expert untimed. fp8
    (low-latency only): DeepEP's default use_fp8=True, x cast on send; no expert step (the
    combine reads the zero-copy buffer as the window left it: zeros, never fp8 codes read as
    bf16, whose subnormal patterns would time the arithmetic instead)."""
    import time

    import ubep.deep_ep as deep_ep
    from ._deep_ep_ll import copy_recv_to_combine_buffer
    R, H = group.size, x.shape[1]
    if latency:
        buf = deep_ep.Buffer(group, num_rdma_bytes=deep_ep.Buffer.get_low_latency_rdma_size_hint(
            T, H, R, E), low_latency_mode=True, num_qps_per_rank=E // R)
    else:
        buf = deep_ep.Buffer(group, num_nvl_bytes=deep_ep.Config().get_nvl_buffer_size_hint(
            2 * H, R))
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    td, tc = [], []
    for i in range(warmup + iters):
        if sync:
            group.barrier()
        t0 = time.perf_counter()
        if latency:
            rx, rc, h, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=fp8)
        else:
            rx, _, rw, _, h, _ = buf.dispatch(x, num_tokens_per_rank=per_rank,
                                              is_token_in_rank=in_rank,
                                              num_tokens_per_expert=per_expert, topk_idx=idx,
                                              topk_weights=w)
        t1 = time.perf_counter()
        if latency and not fp8:  # the same memcpy as the native loop's identity expert
            copy_recv_to_combine_buffer(h)
        if sync:
            group.barrier()
        t2 = time.perf_counter()
        if latency:
            buf.low_latency_combine(rx, idx, w, h, zero_copy=True)
        else:
            buf.combine(rx, h)
        t3 = time.perf_counter()
        if i >= warmup:
            td.append((t1 - t0) * 1e6)
            tc.append((t3 - t2) * 1e6)
    return td, tc


class Ctx:
    """What the per-rank loop needs from its launcher: the ubep group, the per-iteration
    slowest-rank reduction, the sum of an int over ranks, torch.distributed (for the torch
    path; None: not available) and, under mpirun, the communicator and topology
    (``_bench_hosts``)."""

    def __init__(self, rank, ranks, group, slowest, total, dist, label, comm=None,
                 topology=None):
        self.rank, self.ranks, self.group, self.dist = rank, ranks, group, dist
        self.slowest, self.total, self.label = slowest, total, label
        self.comm, self.topology = comm, topology


def rank_main(rank, ranks, port, args, out_path):
    """One local process of ``python3 -m ubep.bench`` (torch.multiprocessing.spawn's target)."""
    import torch
    import torch.distributed as dist

    import ubep
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # local processes: never depend on DNS
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    ctx = Ctx(rank, ranks, ubep.make_group(), lambda t: slowest(dist, t),
              lambda n: total(dist, n), dist, f"processes({ranks}, torch.distributed gloo set-up)")
    report = run_rank(ctx, args)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


def run_rank(ctx, args):
    """Every workload and impl on this rank; the report (the same on every rank)."""
    import time

    import torch

    import ubep
    rank, ranks, group, dist = ctx.rank, ctx.ranks, ctx.group, ctx.dist
    algos = [a for a in args.algo.split(",") if a]
    sync = not args.no_barrier
    report = {"results": [], "binding": [], "configs": []}
    for name in args.workloads:
        wl = dict(WORKLOADS[name])
        iters = args.iters or wl["iters"]
        warmup = args.warmup if args.warmup is not None else wl["warmup"]
        T, H, K, E = getattr(args, "tokens", None) or wl["tokens"], 7168, 8, 256
        latency = wl["layout"] == "latency"
        rng = np.random.default_rng(args.seed * 131 + rank)
        idx_np, w_np = routing(rng, T, K, E)
        x = torch.from_numpy(rng.uniform(-1, 1, size=(T, H)).astype(np.float32)).to(torch.bfloat16)
        idx, w = torch.from_numpy(idx_np), torch.from_numpy(w_np)
        row = H * 2
        buf = ubep.Buffer(group, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K,
                          dtype=torch.bfloat16, enable_latency_layout=latency,
                          placement=args.placement)
        cfg = dict(workload=name, group=ctx.label, topology=ctx.topology,
                   ranks=ranks, tokens=T, hidden=H, topk=K, experts=E, dtype="bf16",
                   layout=wl["layout"], routing="uniform", iters=iters, warmup=warmup,
                   num_workers=buf.config()["num_workers"], placement=buf.config()["placement"],
                   barrier_before_each_call=sync)
        report["configs"].append(cfg)
        for algo in [a for a in algos if a in ("ubep", "bsp")]:
            buf.algorithm = algo
            td, tc, cpp = [], [], []
            # Python and C++ loops in alternating rounds, so a change in machine load hits both.
            rounds = min(5, iters)
            for rnd in range(rounds):
                n = iters // rounds + (rnd < iters % rounds)
                w_up = warmup if rnd == 0 else 1
                for i in range(w_up + n):
                    if sync:
                        group.barrier()
                    t0 = time.perf_counter()
                    r = buf.dispatch(x, idx, w, layout=wl["layout"])
                    t1 = time.perf_counter()
                    buf.copy_recv_to_combine_buffer()  # untimed, the same memcpy as the C++ loop
                    cb = buf.combine_buffer(r.handle)
                    if sync:
                        group.barrier()
                    t2 = time.perf_counter()
                    buf.combine(cb, r.handle)
                    t3 = time.perf_counter()
                    if i >= w_up:
                        td.append((t1 - t0) * 1e6)
                        tc.append((t3 - t2) * 1e6)
                cpp += buf.time_calls(x, idx, w, layout=wl["layout"], iters=n, warmup=w_up,
                                      barrier=sync)
            rx = r.recv_x
            if latency:
                recv_rows = float(r.recv_count.sum())
                back_rows = float((idx >= 0).sum())
            else:
                recv_rows = float(rx.shape[0])
                back_rows = float(sum(len(set((e // (E // ranks)) for e in r if e >= 0))
                                      for r in idx_np.tolist()))
            for op, times, cpp_times, nbytes in (
                    ("dispatch", td, [c[0] for c in cpp], recv_rows * row),
                    ("combine", tc, [c[1] for c in cpp], back_rows * row)):
                py = summary(ctx.slowest(times), nbytes)
                cc = summary(ctx.slowest(cpp_times), nbytes)
                report["results"].append(dict(impl=algo, op=op, workload=name, **py))
                report["binding"].append(dict(
                    impl=algo, op=op, workload=name, python_median_us=py["median_us"],
                    cpp_median_us=cc["median_us"], cpp_p99_us=cc["p99_us"],
                    overhead_us=py["median_us"] - cc["median_us"],
                    overhead_pct=100.0 * (py["median_us"] - cc["median_us"]) / cc["median_us"]))
        for impl in (a for a in ("deep_ep", "deep_ep_fp8") if a in algos):
            fp8 = impl == "deep_ep_fp8"
            if fp8 and not latency:
                continue  # DeepEP's normal mode takes fp8 codes the caller made: not timed here
            td, tc = deep_ep_path(group, x, idx, w, T, E, latency, warmup, iters, sync, fp8)
            # The same bytes as the native rows (GB/s needs them; 0 without ubep or bsp); an
            # fp8 row is the codes and a 4-byte scale per 128 channels.
            nbytes = {d["op"]: d["bytes_per_rank"] for d in report["results"]
                      if d["workload"] == name and d["impl"] in ("ubep", "bsp")}
            if fp8 and "dispatch" in nbytes:
                nbytes["dispatch"] *= (H + 4 * -(-H // 128)) / (2 * H)
            for op, times in (("dispatch", td), ("combine", tc)):
                report["results"].append(dict(impl=impl, op=op, workload=name, **summary(
                    ctx.slowest(times), nbytes.get(op, 0.0))))
        for base_name in (b for b in ("mpi", "oneccl") if b in algos):
            # The C++ AlltoallBaseline timed in C++: over MPI_Alltoallv ("mpi", under mpirun) or
            # oneCCL's alltoallv ("oneccl", any group); then ubep's y against its y, bit for bit.
            base = buf.baseline("oneccl" if base_name == "oneccl" else "default")
            times = base.time_calls(x, idx, w, latency, iters, warmup, sync)
            nbytes = {d["op"]: d["bytes_per_rank"] for d in report["results"]
                      if d["workload"] == name and d["impl"] in ("ubep", "bsp")}
            for op, i in (("dispatch", 0), ("combine", 1)):
                report["results"].append(dict(impl=base_name, op=op, workload=name, **summary(
                    ctx.slowest([t[i] for t in times]), nbytes.get(op, 0.0))))
            report.setdefault("identity", []).append(dict(
                workload=name, baseline=base_name, **identity_check(
                    ctx, buf, base, base_name, x, idx, w, T, E, latency)))
            del base
        if "torch" in algos and dist is not None:
            d_fn, c_fn = torch_path(dist, x, idx, w, ranks, E)
            td, tc = [], []
            for i in range(warmup + iters):
                if sync:
                    group.barrier()
                t0 = time.perf_counter()
                rows, _ = d_fn()
                t1 = time.perf_counter()
                if sync:
                    group.barrier()
                t2 = time.perf_counter()
                c_fn(rows)
                t3 = time.perf_counter()
                if i >= warmup:
                    td.append((t1 - t0) * 1e6)
                    tc.append((t3 - t2) * 1e6)
            pairs = float((idx >= 0).sum())
            for op, times, nbytes in (("dispatch", td, rows.shape[0] * row),
                                      ("combine", tc, pairs * row)):
                report["results"].append(dict(impl="torch", op=op, workload=name,
                                              **summary(ctx.slowest(times), nbytes)))
        del buf
    return report


def _call(buf, x, idx, w, T, E, latency):
    """One ubep call with the identity expert: (received rows, y) as int16 bit patterns."""
    import torch
    H = x.shape[1]
    r = buf.dispatch(x, idx, w, layout="latency" if latency else "throughput")
    rx = r.recv_x
    if latency:
        rr = r.recv_range
        rows = [rx[e, int(b):int(b) + int(n)] for e in range(rx.shape[0])
                for b, n in rr[e].tolist()]
    else:
        rows = [rx]
    rows = torch.cat([t.reshape(-1, H) for t in rows]).view(torch.int16).numpy().copy()
    buf.copy_recv_to_combine_buffer()
    y = buf.combine(buf.combine_buffer(r.handle), r.handle)
    return rows, y.view(torch.int16).numpy().copy()


def identity_check(ctx, buf, base, base_name, x, idx, w, T, E, latency):
    """Elements (summed over ranks) in which ubep's y differs from the baseline's (``y_vs_mpi``,
    ``y_vs_oneccl``) on the same group, and, under mpirun with forced hosts, in which its
    received rows and y differ from a one-host group of the same processes (combine across hosts
    adds per-host partials, docs/SEMANTICS.md, so y may differ there in the last bit; rows may
    not)."""
    import ubep
    comm = ctx.comm
    algo = buf.algorithm
    buf.algorithm = "ubep"
    rows, y = _call(buf, x, idx, w, T, E, latency)
    buf.algorithm = algo
    y_base = np.frombuffer(base.last_y(), dtype=np.int16)
    differ = int(y.size) if y.size != y_base.size else int((y.ravel() != y_base).sum())
    out = {"elements": ctx.total(int(y.size)), f"y_vs_{base_name}": ctx.total(differ)}
    if comm is not None and ctx.group.num_hosts > 1:
        one = ubep.make_group(comm)  # the hosts MPI finds: one, when they are forced
        if one.num_hosts == 1:
            c = buf.config()
            b1 = ubep.Buffer(one, hidden=x.shape[1], num_experts=E, max_tokens_per_rank=T,
                             max_topk=idx.shape[1], dtype="bf16", enable_latency_layout=latency,
                             placement=c["placement"])
            rows1, y1 = _call(b1, x, idx, w, T, E, latency)
            out.update(rows=comm.allreduce(int(rows.size)),
                       rows_vs_one_host=comm.allreduce(
                           int(rows.size) if rows.shape != rows1.shape else
                           int((rows != rows1).sum())),
                       y_vs_one_host=comm.allreduce(int((y != y1).sum())))
    return out


def print_report(rep):
    for cfg in rep["configs"]:
        w = cfg["workload"]
        print(f"\n{w}: {cfg['ranks']} process ranks, tokens={cfg['tokens']} hidden={cfg['hidden']} "
              f"top-{cfg['topk']} of {cfg['experts']} experts, bf16, {cfg['layout']} layout, "
              f"iters={cfg['iters']}" + (f"; {cfg['group']}" if cfg.get("topology") else ""))
        print(f"{'impl':<11} {'op':<9} {'median_us':>10} {'p99_us':>10} {'GB/s':>8}")
        rows = [r for r in rep["results"] if r["workload"] == w]
        for r in rows:
            print(f"{r['impl']:<11} {r['op']:<9} {r['median_us']:>10.1f} {r['p99_us']:>10.1f} "
                  f"{r['gbps']:>8.2f}")
        tot = {}
        for r in rows:
            tot[r["impl"]] = tot.get(r["impl"], 0.0) + r["median_us"]
        for ref in ("mpi", "torch"):
            if ref in tot:
                print(f"dispatch+combine median vs {ref}: " + "  ".join(
                    f"{k} {v:.1f} us ({v / tot[ref]:.2f}x {ref})" for k, v in tot.items()))
        for e in (e for e in rep.get("identity", []) if e["workload"] == w):
            b = e.get("baseline", "mpi")
            line = f"bit-identity (ubep, all ranks): y vs {b} baseline {e['y_vs_' + b]} of " \
                   f"{e['elements']} elements differ"
            if "rows_vs_one_host" in e:
                line += (f"; vs one host: received rows {e['rows_vs_one_host']} of {e['rows']}, "
                         f"y {e['y_vs_one_host']} of {e['elements']} differ")
            print(line)
        for b in (b for b in rep["binding"] if b["workload"] == w):
            print(f"binding {b['impl']:<5} {b['op']:<9} python {b['python_median_us']:9.1f} us"
                  f"  C++ loop {b['cpp_median_us']:9.1f} us  overhead {b['overhead_us']:+7.1f} us"
                  f" ({b['overhead_pct']:+.1f}%)")
        for e in (e for e in rep["ubep_bench"] if e["workload"] == w):
            if "results" in e:
                print("ubep-bench (" + e["command"].split(" --json")[0] + "): " + "  ".join(
                    f"{r['impl']} {r['op']} {r['median_us']:.1f} us" for r in e["results"]))
            else:
                print(f"ubep-bench failed: {e['error']}")
