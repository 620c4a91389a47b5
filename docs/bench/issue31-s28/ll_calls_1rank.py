import time, torch, ubep, statistics, sys
import ubep.deep_ep as deep_ep
def body(group):
    T,H,E,K=1,7168,256,8
    dbuf = deep_ep.Buffer(group, num_rdma_bytes=2*deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, 1, E), low_latency_mode=True, num_qps_per_rank=E, num_workers=0)
    x = torch.randn(T,H).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int64)
    w = torch.rand(T,K)
    st = {}
    for fp8 in (False, True):
      for hook in (False, True):
        def de():
            t0 = time.perf_counter()
            rx, rc, h, _, hk = dbuf.low_latency_dispatch(x, idx, T, E, use_fp8=fp8, return_recv_hook=hook)
            if hook: hk()
            t1 = time.perf_counter()
            y, _, hk2 = dbuf.low_latency_combine(dbuf.get_next_low_latency_combine_buffer(h), idx, w, h, zero_copy=True, return_recv_hook=hook)
            if hook: hk2()
            t2 = time.perf_counter()
            st.setdefault(("d", fp8, hook), []).append(t1-t0); st.setdefault(("c", fp8, hook), []).append(t2-t1)
        for _ in range(3000): de()
    print({k: round(statistics.median(v[500:])*1e6, 2) for k, v in st.items()})
ubep.run_on_threads(1, body)
