import time, torch, ubep, statistics, sys
import ubep.deep_ep as deep_ep
from ubep import _deep_ep_normal as N, _deep_ep_window as W, _arrays
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
    rx, _, rw, _, h, _ = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
    nb = h._window
    local = torch.cat([per_rank.to(torch.int64).view(-1), per_expert.to(torch.int64).view(-1)])
    st = {}
    def tm(name, f, n=600):
        for i in range(n):
            t0 = time.perf_counter(); f(); t1 = time.perf_counter()
            if i >= 100: st.setdefault(name, []).append(t1-t0)
    def full():
        rx, _, rw, _, h, _ = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
    tm("full", full)
    tm("layout", lambda: N.get_dispatch_layout(idx, E, R))
    tm("native_dispatch", lambda: W.dispatch(nb, x, idx, w, latency=False))
    def nd_owned():
        r = W.dispatch(nb, x, idx, w, latency=False); N._owned_recv(nb, r[4], r[0])
    tm("native_dispatch+owned", nd_owned)
    tm("allgather", lambda: N._allgather(buf, local))
    print(group.rank, {k: round(statistics.median(v)*1e6, 1) for k, v in st.items()})
ubep.run_on_threads(R, body)
