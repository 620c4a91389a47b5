import time, torch, ubep, statistics, sys
import ubep.deep_ep as deep_ep
from ubep import _deep_ep_normal as N
T = int(sys.argv[1])
def body(group):
    H,E,K=7168,256,8
    R = 1
    buf = deep_ep.Buffer(group, num_nvl_bytes=deep_ep.Config().get_nvl_buffer_size_hint(2*H, 1), num_workers=0)
    x = torch.randn(T,H).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(torch.int64)
    w = torch.rand(T,K)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    rx, _, rw, _, h, _ = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
    nb = h._window
    counts = N._aux(buf, "allgather", R + E, 1, R, N.topk_capacity(R, R), "cpu")
    u8 = in_rank.view(torch.uint8)
    t0 = time.perf_counter()
    for i in range(int(sys.argv[2])):
        nb.native.deep_ep_normal_dispatch(counts.native, x, None, "", idx, w, u8, per_rank, per_expert, 1)
    print((time.perf_counter()-t0)/int(sys.argv[2])*1e6)
ubep.run_on_threads(1, body)
