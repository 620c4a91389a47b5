"""Megatron's backward calls in ubep.deep_ep (normal mode), the session's native calls against
the Python sequences they replace (still in the module: the GPU windows' path), alternated in
one run: a cached dispatch (buf.dispatch(x, handle=h)) and a combine with topk_weights.
Usage: mpirun -np 2 python3 abw.py TOKENS [ROUNDS] [CALLS]"""
import statistics, sys, time
import torch, ubep
import ubep.deep_ep as deep_ep
from ubep import _deep_ep_normal as N, _deep_ep_window as W
from mpi4py import MPI
T = int(sys.argv[1]); ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
CALLS = int(sys.argv[3]) if len(sys.argv) > 3 else 100
H, E, K = 7168, 256, 8
group = ubep.make_group(MPI.COMM_WORLD)
R = group.size
torch.manual_seed(group.rank)
buf = deep_ep.Buffer(group, num_nvl_bytes=deep_ep.Config().get_nvl_buffer_size_hint(2 * H, R))
x = torch.randn(T, H).to(torch.bfloat16)
idx = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int64)
w = torch.rand(T, K)
per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
rx, _, rw, _, h, _ = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                  num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
nb = h._window


def old_cached():  # 854b5e2's cached dispatch: window lookup, dispatch, rows copied out
    route = h._route
    wnd = N.window(buf, "bf16", H, h._E, route.shape[1], route.shape[0], "cpu")
    recv_x, _, _, _, d = W.dispatch(wnd, x, route, latency=False)
    N._remember(h, wnd, d, (x, None))
    return N._owned_recv(wnd, d, recv_x)


def old_combine_weights():  # 854b5e2's combine with topk_weights (no replay: h is the last)
    d = h._dispatch
    d.combined = True
    return nb.native.combine_new(rx, d.id, None), N._combine_weights(buf, h, rw)


variants = {
    "cached dispatch": (old_cached, lambda: buf.dispatch(x, handle=h)),
    "combine+weights": (old_combine_weights, lambda: buf.combine(rx, h, topk_weights=rw)),
}
med = {}
for rnd in range(ROUNDS):
    for name, fns in variants.items():
        for which, f in zip(("old", "new"), fns):
            ts = []
            for i in range(CALLS + 10):
                group.barrier()
                t0 = time.perf_counter(); f(); t1 = time.perf_counter()
                if i >= 10:
                    ts.append((t1 - t0) * 1e6)
            med.setdefault((name, which), []).append(statistics.median(ts))
# the slower rank's median per round (every call waits for its peers)
allm = MPI.COMM_WORLD.allgather(med)
if group.rank == 0:
    print(f"{R} ranks, {T} tokens per rank, {ROUNDS} rounds x {CALLS} calls; median us per round "
          f"(slower rank), pair ratio new/old per round")
    for name in variants:
        o = [max(m[(name, "old")][r] for m in allm) for r in range(ROUNDS)]
        n = [max(m[(name, "new")][r] for m in allm) for r in range(ROUNDS)]
        ratios = [b / a for a, b in zip(o, n)]
        print(f"{name:16s} old {[round(v, 1) for v in o]} new {[round(v, 1) for v in n]} "
              f"ratio median {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
