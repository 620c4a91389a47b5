"""ubep: expert-parallel dispatch and combine for Mixture-of-Experts.

    import ubep
    buf = ubep.Buffer(group, hidden=7168, num_experts=256, max_tokens_per_rank=128)
    r = buf.dispatch(x, topk_idx, topk_weights, layout="latency")
    ...  # experts on r.recv_x[e, :r.recv_count[e]]
    y = buf.combine(expert_out, r.handle)

``group``: ubep.run_on_threads(n, fn) hands fn a ubep.Group; under torchrun pass a
torch.distributed process group (gloo), under mpirun an mpi4py communicator. Arrays go through
DLPack (torch tensors, NumPy arrays) without copies; results are views of ubep's memory (see
ubep.buffer and docs/PYTHON.md for how long they stay valid; copy=True for owned copies).

Code written against DeepEP's API imports ``ubep.deep_ep`` instead (docs/DEEPEP.md).
"""
from . import _arrays  # registers the DLPack converters with the extension
from ._arrays import bf16_bits, bf16_to_float32
from ._ubep import Error, Group, InvalidArgument, PeerFailedError, TimeoutError  # noqa: A004
from .buffer import Buffer, DispatchResult, Handle
from .groups import make_group, make_rejoin_group, make_tcp_group, run_on_threads

__all__ = ["Buffer", "DispatchResult", "Error", "Group", "Handle", "InvalidArgument",
           "PeerFailedError", "TimeoutError", "bf16_bits", "bf16_to_float32", "make_group",
           "make_rejoin_group", "make_tcp_group", "run_on_threads"]
