import statistics, sys, time, torch, ubep
import ubep.deep_ep as deep_ep
from ubep import _deep_ep_normal as N, _deep_ep_window as W
from mpi4py import MPI
T=int(sys.argv[1]); H,E,K=7168,256,8
group = ubep.make_group(MPI.COMM_WORLD); R=group.size
torch.manual_seed(group.rank)
buf = deep_ep.Buffer(group, num_nvl_bytes=deep_ep.Config().get_nvl_buffer_size_hint(2 * H, R))
x = torch.randn(T, H).to(torch.bfloat16)
idx = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int64)
w = torch.rand(T, K)
per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
rx, _, rw, _, h, _ = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
nb=h._window
ub = ubep.Buffer(group, max_tokens_per_rank=T, hidden=H, num_experts=E, max_topk=K) if hasattr(ubep,'Buffer') else None
st={}
def tm(name, f, n=300):
    for i in range(n):
        group.barrier(); t0=time.perf_counter(); f(); t1=time.perf_counter()
        if i>=50: st.setdefault(name,[]).append((t1-t0)*1e6)
def full(): buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
def wd(): W.dispatch(nb, x, idx, w, latency=False)
def wdo():
    r=W.dispatch(nb, x, idx, w, latency=False); N._owned_recv(nb, r[4], r[0])
for rr in range(2):
    tm("deep_ep dispatch", full); tm("window dispatch", wd); tm("window dispatch+copy out", wdo)
    if ub is not None: tm("ubep.Buffer dispatch", lambda: ub.dispatch(x, idx, w))
med={k: round(statistics.median(v),1) for k,v in st.items()}
print(group.rank, "rows", rx.shape[0], med, flush=True)
