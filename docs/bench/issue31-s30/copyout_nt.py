import statistics, sys, time, torch, ubep
import ubep.deep_ep as deep_ep
from ubep import _deep_ep_normal as N, _deep_ep_window as W, _arrays
from mpi4py import MPI
T=int(sys.argv[1]); H,E,K=7168,256,8; R=2
group = ubep.make_group(MPI.COMM_WORLD)
torch.manual_seed(group.rank)
buf = deep_ep.Buffer(group, num_nvl_bytes=deep_ep.Config().get_nvl_buffer_size_hint(2 * H, R))
x = torch.randn(T, H).to(torch.bfloat16)
idx = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int64)
w = torch.rand(T, K)
per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
rx, _, rw, _, h, _ = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
st={}
def tm(name, f, n=int(__import__("os").environ.get("N", "200"))):
    for i in range(n):
        group.barrier()
        t0=time.perf_counter(); f(); t1=time.perf_counter()
        if i>=max(4, n // 5): st.setdefault(name,[]).append(t1-t0)
import numpy as np
def cr():
    gx = buf.dispatch(x, handle=h)[0]
    np.bitwise_or.reduce(gx.view(torch.int64).numpy(), axis=None)
def rd():
    np.bitwise_or.reduce(rx.view(torch.int64).numpy(), axis=None)
for r in range(2):
  tm("cached", lambda: buf.dispatch(x, handle=h))
  tm("cached+read", cr)
  tm("read of a cached result", rd)
  tm("native_dispatch", lambda: W.dispatch(h._window, x, h._route, latency=False))
print(group.rank, {k: round(statistics.median(v)*1e6,1) for k,v in st.items()}, flush=True)
