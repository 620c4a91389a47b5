"""A DeepEP user's script, as DeepEP's V1 README shapes it (get_buffer from the config hints,
dispatch_forward / combine_forward / their backward passes, low-latency decode with hooks), with
only the import and the device changed: ``import ubep.deep_ep as deep_ep`` and CPU tensors.
Each rank checks its MoE output against the same layer computed densely.

    python3 deep_ep_script.py RANKS     (torch.multiprocessing.spawn + gloo)
"""
import os
import sys
from typing import Optional

import torch
import torch.distributed as dist

import ubep.deep_ep as deep_ep
from ubep.deep_ep import Buffer, EventOverlap

_buffer: Optional[Buffer] = None


def get_buffer(group: dist.ProcessGroup, hidden_bytes: int) -> Buffer:
    global _buffer
    num_nvl_bytes, num_rdma_bytes = 0, 0
    for config in (Buffer.get_dispatch_config(group.size()), Buffer.get_combine_config(group.size())):
        num_nvl_bytes = max(config.get_nvl_buffer_size_hint(hidden_bytes, group.size()), num_nvl_bytes)
        num_rdma_bytes = max(config.get_rdma_buffer_size_hint(hidden_bytes, group.size()), num_rdma_bytes)
    if _buffer is None or _buffer.group != group or _buffer.num_nvl_bytes < num_nvl_bytes \
            or _buffer.num_rdma_bytes < num_rdma_bytes:
        _buffer = Buffer(group, num_nvl_bytes, num_rdma_bytes)
    return _buffer


def dispatch_forward(x, topk_idx, topk_weights, num_experts, previous_event=None):
    num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank, previous_event = \
        _buffer.get_dispatch_layout(topk_idx, num_experts, previous_event=previous_event, async_finish=True,
                                    allocate_on_comm_stream=previous_event is not None)
    recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event = \
        _buffer.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights,
                         num_tokens_per_rank=num_tokens_per_rank, num_tokens_per_rdma_rank=num_tokens_per_rdma_rank,
                         is_token_in_rank=is_token_in_rank, num_tokens_per_expert=num_tokens_per_expert,
                         previous_event=previous_event, async_finish=True,
                         allocate_on_comm_stream=True)
    return recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event


def dispatch_backward(grad_recv_x, grad_recv_topk_weights, handle):
    combined_grad_x, combined_grad_recv_topk_weights, event = \
        _buffer.combine(grad_recv_x, handle, topk_weights=grad_recv_topk_weights, async_finish=True)
    return combined_grad_x, combined_grad_recv_topk_weights, event


def combine_forward(x, handle, previous_event=None):
    combined_x, _, event = _buffer.combine(x, handle, async_finish=True, previous_event=previous_event,
                                           allocate_on_comm_stream=previous_event is not None)
    return combined_x, event


def combine_backward(grad_combined_x, handle, previous_event=None):
    grad_x, _, _, _, _, event = _buffer.dispatch(grad_combined_x, handle=handle, async_finish=True,
                                                 previous_event=previous_event,
                                                 allocate_on_comm_stream=previous_event is not None)
    return grad_x, event


def scale_of(e):  # expert e multiplies its input by this
    return (e + 1) / 8


def main(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)))
    tokens, hidden, num_experts, num_topk = 16, 256, 8, 2
    torch.manual_seed(rank)
    x = torch.randn((tokens, hidden)).to(torch.bfloat16)
    topk_idx = torch.topk(torch.rand(tokens, num_experts), num_topk).indices
    topk_weights = torch.rand(tokens, num_topk)
    scale = torch.tensor([scale_of(e) for e in range(num_experts)])
    dense = (x.float() * (topk_weights * scale[topk_idx]).sum(1, keepdim=True)).to(torch.bfloat16)
    local = num_experts // world

    # Normal mode: training-style forward and backward.
    get_buffer(group, hidden * 2)
    recv_x, recv_topk_idx, recv_topk_weights, counts, handle, event = \
        dispatch_forward(x, topk_idx, topk_weights, num_experts, Buffer.capture())
    event.current_stream_wait()
    assert sum(counts) == int((recv_topk_idx >= 0).sum())
    mult = torch.where(recv_topk_idx >= 0, recv_topk_weights * scale[(recv_topk_idx + rank * local).clamp(min=0)],
                       torch.zeros(()))
    expert_out = (recv_x.float() * mult.sum(1, keepdim=True)).to(torch.bfloat16)
    y, event = combine_forward(expert_out, handle)
    assert torch.allclose(y.float(), dense.float(), atol=0.05, rtol=0.02), (y - dense).abs().max()
    grad_x, event = combine_backward(y, handle)              # the backward of combine: a dispatch
    begin = int(handle[0][rank - 1][rank]) if rank else 0
    end = int(handle[0][rank][rank])
    assert torch.equal(grad_x[begin:end], y[handle[3][begin:end].long()])  # this rank's own rows
    grad, grad_w, event = dispatch_backward(grad_x, recv_topk_weights, handle)  # and of dispatch
    n_dest = handle[4].sum(1, keepdim=True)
    assert torch.equal(grad_w, topk_weights)               # each weight came back from its owner
    assert torch.equal(grad.float(), y.float() * n_dest)   # every destination sent y back

    # Low-latency decode with the receive hook.
    T = tokens
    num_rdma_bytes = Buffer.get_low_latency_rdma_size_hint(T, hidden, world, num_experts)
    ll = Buffer(group, 0, num_rdma_bytes, low_latency_mode=True, num_qps_per_rank=num_experts // world)
    recv, count, handle, event, hook = ll.low_latency_dispatch(x, topk_idx, T, num_experts, use_fp8=False,
                                                               async_finish=False, return_recv_hook=True)
    hook()
    out = torch.empty_like(recv)
    for i in range(local):
        out[i, :count[i]] = (recv[i, :count[i]].float() * scale_of(rank * local + i)).to(torch.bfloat16)
    y, event, hook = ll.low_latency_combine(out, topk_idx, topk_weights, handle, async_finish=False,
                                            return_recv_hook=True)
    hook()
    assert torch.allclose(y.float(), dense.float(), atol=0.05, rtol=0.02), (y - dense).abs().max()
    assert isinstance(event, EventOverlap) and deep_ep.topk_idx_t == torch.int64
    print(f"rank {rank}: DeepEP script OK", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    torch.multiprocessing.spawn(main, args=(n, port), nprocs=n)
