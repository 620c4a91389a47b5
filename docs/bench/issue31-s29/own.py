import time, torch, ubep, statistics, sys
import ubep.deep_ep as deep_ep
T = int(sys.argv[1])
def body(group):
    H,E,K=7168,256,8
    buf = deep_ep.Buffer(group, num_nvl_bytes=deep_ep.Config().get_nvl_buffer_size_hint(2*H, 1))
    x = torch.randn(T,H).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int64)
    w = torch.rand(T,K)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    rx, _, rw, _, h, _ = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
    nb, d = h._window, h._dispatch
    view = nb.native.view("combine_buffer", d.id, 0)
    st = {}
    def tm(name, f, n=300):
        for i in range(n):
            t0 = time.perf_counter(); f(); t1 = time.perf_counter()
            if i >= 30: st.setdefault(name, []).append(t1-t0)
    tm("owned_recv", lambda: nb.native.owned_recv(d.id))
    keep = []
    def own_keep():
        keep.append(nb.native.owned_recv(d.id))
        if len(keep) > 3: keep.pop(0)
    tm("owned_recv_keep3", own_keep)
    dst = torch.empty_like(rx)
    tm("copy_into_existing", lambda: dst.copy_(rx))
    tm("clone", lambda: rx.clone())
    tm("combine_new", lambda: nb.native.combine_new(rx, d.id, None))
    tm("combine_into", lambda: nb.native.combine_into(rx, d.id, None, dst[:T]))
    print(T, rx.shape, {k: round(statistics.median(v)*1e6, 1) for k, v in st.items()})
ubep.run_on_threads(1, body)
