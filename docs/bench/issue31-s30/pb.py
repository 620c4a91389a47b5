import statistics, sys, time, torch, ubep, os
from mpi4py import MPI
H,E,K=7168,256,8
group = ubep.make_group(MPI.COMM_WORLD); R=group.size
torch.manual_seed(group.rank)
out={}
for T in [int(a) for a in sys.argv[1:]]:
    x = torch.randn(T, H).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int64)
    w = torch.rand(T, K)
    ub = ubep.Buffer(group, max_tokens_per_rank=T, hidden=H, num_experts=E, max_topk=K)
    ts=[]
    for i in range(300):
        group.barrier(); t0=time.perf_counter(); ub.dispatch(x, idx, w); t1=time.perf_counter()
        if i>=60: ts.append((t1-t0)*1e6)
    out[T]=round(statistics.median(ts),1)
    del ub
allm = MPI.COMM_WORLD.allgather(out)
if group.rank==0: print("XPLAIN", os.environ.get("UBEP_XPLAIN","0"), {T: max(m[T] for m in allm) for T in out}, flush=True)
