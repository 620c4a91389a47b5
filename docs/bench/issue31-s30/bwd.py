"""Megatron's four DeepEP normal-mode calls per MoE layer, timed: forward dispatch and combine,
and backward's cached dispatch (handle=) and combine with topk_weights. Thread ranks, or under
mpirun process ranks (RANKS ignored).
Usage: [mpirun -np 2] bwd.py RANKS TOKENS [ITERS]"""
import statistics, sys, time
import torch, ubep
import ubep.deep_ep as deep_ep
R = int(sys.argv[1]); T = int(sys.argv[2]); N = int(sys.argv[3]) if len(sys.argv) > 3 else 300
H, E, K = 7168, 256, 8
def body(group):
    torch.manual_seed(group.rank)
    buf = deep_ep.Buffer(group, num_nvl_bytes=deep_ep.Config().get_nvl_buffer_size_hint(2 * H, R))
    x = torch.randn(T, H).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int64)
    w = torch.rand(T, K)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    st = {}
    for i in range(N + N // 5):
        group.barrier(); t0 = time.perf_counter()
        rx, _, rw, _, h, _ = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                          num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
        group.barrier(); t1 = time.perf_counter()
        y, _, _ = buf.combine(rx, h)
        group.barrier(); t2 = time.perf_counter()
        gy, gw, _ = buf.combine(rx, h, topk_weights=rw)       # dispatch's backward
        group.barrier(); t3 = time.perf_counter()
        gx, _, _, _, _, _ = buf.dispatch(y, handle=h)          # combine's backward
        t4 = time.perf_counter()
        if i >= N // 5:
            for k, v in (("dispatch", t1 - t0), ("combine", t2 - t1), ("combine+w", t3 - t2),
                         ("cached dispatch", t4 - t3)):
                st.setdefault(k, []).append(v)
    print(group.rank, {k: round(statistics.median(v) * 1e6, 1) for k, v in st.items()}, flush=True)
if "OMPI_COMM_WORLD_SIZE" in __import__("os").environ:
    from mpi4py import MPI
    R = MPI.COMM_WORLD.Get_size()
    body(ubep.make_group(MPI.COMM_WORLD))
else:
    ubep.run_on_threads(R, body)
