import time, torch, ubep, statistics, sys, cProfile, pstats
import ubep.deep_ep as deep_ep
R = int(sys.argv[1]) if len(sys.argv) > 1 else 1
T = int(sys.argv[2]) if len(sys.argv) > 2 else 4
def body(group):
    H,E,K=7168,256,8
    torch.manual_seed(group.rank)
    buf = deep_ep.Buffer(group, num_nvl_bytes=deep_ep.Config().get_nvl_buffer_size_hint(2*H, R))
    x = torch.randn(T,H).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int64)
    w = torch.rand(T,K)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    td, tc = [], []
    def one():
        t0 = time.perf_counter()
        rx, _, rw, _, h, _ = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                          num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
        t1 = time.perf_counter()
        buf.combine(rx, h)
        t2 = time.perf_counter()
        td.append(t1-t0); tc.append(t2-t1)
    for _ in range(200): one()
    if group.rank == 0 and len(sys.argv) > 3:
        pr = cProfile.Profile(); pr.enable()
        for _ in range(500): one()
        pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    else:
        for _ in range(500): one()
    print(group.rank, "dispatch", round(statistics.median(td[200:])*1e6,1), "combine", round(statistics.median(tc[200:])*1e6,1))
ubep.run_on_threads(R, body)
