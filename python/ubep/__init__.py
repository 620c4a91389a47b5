"""ubep: expert-parallel dispatch and combine for Mixture-of-Experts, with DeepEP's API.

    import ubep
    buf = ubep.Buffer(group, hidden=7168, num_experts=256, max_tokens_per_rank=128)
    recv_x, recv_count, handle, event, hook = buf.low_latency_dispatch(x, topk_idx, 128, 256)
    ...  # experts on recv_x[e, :recv_count[e]]
    y, event, hook = buf.low_latency_combine(expert_out, topk_idx, topk_weights, handle)

``group``: ubep.run_on_threads(n, fn) hands fn a ubep.Group; under torchrun pass a
torch.distributed process group (gloo), under mpirun an mpi4py communicator. Arrays go through
DLPack (torch tensors, NumPy arrays) without copies; results are views of ubep's memory (see
ubep.buffer and docs/PYTHON.md for how long they stay valid; copy=True for owned copies).
"""
from . import _arrays  # registers the DLPack converters with the extension
from ._arrays import bf16_bits, bf16_to_float32
from ._ubep import Error, Group, InvalidArgument, PeerFailedError, TimeoutError  # noqa: A004
from .buffer import Buffer, EventOverlap, Handle, get_dispatch_layout
from .groups import make_group, make_rejoin_group, run_on_threads

__all__ = ["Buffer", "EventOverlap", "Error", "Group", "Handle", "InvalidArgument",
           "PeerFailedError", "TimeoutError", "bf16_bits", "bf16_to_float32", "get_dispatch_layout", "make_group",
           "make_rejoin_group",
           "run_on_threads"]
