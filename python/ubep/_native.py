"""The one native layer under both Python APIs (``ubep.Buffer`` and ``ubep.deep_ep.Buffer``).

The extension's ``_ubep.Buffer`` is one rank's window; this module makes one from keyword
shapes (``make_window``) and holds the argument work both APIs do before a native call (fp8
inputs and results). Neither API reaches into the other: each holds the windows it made.

The extension's window methods, as both APIs call them (``kind``: ``_arrays`` TORCH / NUMPY /
DLPACK, the framework results come back in):

* ``dispatch(x, topk_idx, topk_weights, latency, kind, send_only, x_scales, x_dtype)`` ->
  ``(recv_x, recv_topk_idx | None, recv_topk_weights | None, recv_count, dispatch_id,
  recv_x_scales | None)``; ``send_only``: the split phase (``dispatch_recv(kind)`` completes it);
* ``combine(x, dispatch_id, topk_weights, kind, send_only, out)`` -> y;
  ``combine_recv(kind)``; ``combine_into(x | None, dispatch_id, topk_weights, out)`` (cpu, y
  into ``out``, nothing converted; x None: the zero-copy combine buffer);
  ``combine_new(x | None, dispatch_id, topk_weights)`` (the same into a new torch tensor);
* ``view(which, dispatch_id, kind)``: "combine_buffer", "recv_src" or "recv_range" of the last
  dispatch; ``wait_recv_range(dispatch_id, source, local_expert)``;
* ``deep_ep_dispatch`` / ``deep_ep_layout``: DeepEP's low-latency handle tensors made (or
  filled) in C++ (python/src/buffer.hpp);
* ``mask``, ``masked_ranks``, ``rejoin``, ``config()``, ``last_stats()``, ``set_algorithm``,
  ``algorithm``, ``num_local_experts``, ``shared_bytes``; the benchmarks' ``time_calls`` and
  ``expert_identity``.
"""
from . import _arrays, _fp8, _ubep

LAYOUTS = ("throughput", "latency")


def make_window(group, *, hidden, num_experts, max_tokens_per_rank=128, max_topk=8,
                dtype="bf16", algorithm="ubep", num_workers=-1, enable_latency_layout=True,
                sync="fused", placement="compact", fp8_round_scale=False, device="cpu",
                mask_dead_ranks=False):
    """One rank's window on ``group`` (a ``ubep.Group``; collective: every rank makes it with
    the same arguments). Bad values: ``InvalidArgument`` naming them (from the library)."""
    return _ubep.Buffer(group, int(max_tokens_per_rank), int(hidden), _arrays.dtype_name(dtype),
                        int(num_experts), int(max_topk), str(algorithm), int(num_workers),
                        bool(enable_latency_layout), str(sync), str(placement),
                        bool(fp8_round_scale), _arrays.device_name(device),
                        bool(mask_dead_ranks))


def is_latency(layout, what):
    """True for "latency", False for "throughput"; anything else: InvalidArgument naming it."""
    if layout == "latency":
        return True
    if layout == "throughput":
        return False
    raise _ubep.InvalidArgument(
        f"{what}: layout must be 'throughput' or 'latency', got {layout!r}")


def x_args(x, x_scales, window_dtype, what):
    """(x, x_scales, x_dtype) as the extension takes them: fp8 codes (torch.float8_e4m3fn or
    uint8) with their scales, or values (x_dtype "bf16"/"fp32" when an fp8 window casts them on
    send, else "")."""
    if x_scales is not None:
        if window_dtype != "fp8":
            raise _ubep.InvalidArgument(
                f"{what}: x_scales given (fp8 codes) but the buffer's dtype is {window_dtype}; "
                f"make the Buffer with dtype='fp8'")
        return _fp8.codes_in(x, what + ": x"), x_scales, ""
    return x, None, (_fp8.cast_dtype(x) if window_dtype == "fp8" else "")


def recv_codes(recv_x, recv_x_scales):
    """recv_x of an fp8 window as float8_e4m3fn where torch has it (uint8 elsewhere); values
    of a bf16/fp32 window unchanged."""
    return recv_x if recv_x_scales is None else _fp8.codes_out(recv_x)
