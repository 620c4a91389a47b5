"""DeepEP's low-latency dispatch and combine for ubep.deep_ep.Buffer (see deep_ep.py).

Results as DeepEP shapes them: recv_x (or (codes, scales) with fp8) is a view of ubep's window,
valid for the next two dispatches as in DeepEP ("you cannot hold more than 2 low-latency
kernels' result tensors"); recv_count is int32; the handle is the tuple (src_info [local
experts, max_tokens * ranks] int32 source token, layout_range [local experts, ranks] int64
``begin << 32 | count``, num_max_dispatch_tokens_per_rank, hidden, num_experts); combined_x is
a new tensor (or ``out``).
"""
import torch

from . import _ubep
from ._arrays import TORCH
from ._deep_ep_sizing import HINT_TOPK, check_fits, topk_capacity, window_bytes
from .buffer import Handle as _Handle

_empty, _int32, _int64 = torch.empty, torch.int32, torch.int64


class LowLatencyHandle(tuple):
    """DeepEP's 5-tuple, carrying ubep's dispatch (the native buffer and its handle) and what a
    combine of an older dispatch needs to replay it."""


def _not_supported(what, why):
    raise NotImplementedError(f"ubep.deep_ep: {what} is not supported ({why})")


class _Fast:
    """What the common call of one shape needs, found once (the per-call Python work is most of
    ubep.deep_ep's cost over the native API: docs/DEEPEP.md, Performance): a bf16/fp32 dispatch
    without hook on a cpu window of one host, and its combines."""

    __slots__ = ("nb", "b", "El", "rows", "R", "T", "hidden", "E", "out_dtype", "event")

    def __init__(self, buf, nb, T, hidden, E, event):
        self.nb, self.b = nb, nb._buf
        self.El, self.R = nb.num_local_experts, buf.group_size
        self.rows = T * self.R
        self.T, self.hidden, self.E = T, hidden, E
        self.out_dtype = torch.float32 if nb.dtype == "fp32" else torch.bfloat16
        self.event = event  # makes an EventOverlap (not a bound method of buf: no cycle)


def _fast_key(T, E, x, topk_idx):
    # Only 2-D x and topk_idx were ever registered: other shapes miss and take the checks.
    # deep_ep.Buffer.low_latency_dispatch builds the same key inline.
    return (T, E, x.dtype, x.shape[1:], topk_idx.shape[1:], x.is_cpu)


def dispatch(buf, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
             cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats, use_fp8,
             round_scale, use_ue8m0, return_recv_hook):
    # deep_ep.Buffer.low_latency_dispatch takes fast_dispatch for a registered shape.
    fastable = not (use_fp8 or use_ue8m0 or return_recv_hook) and \
        dispatch_wait_recv_cost_stats is None
    if dispatch_wait_recv_cost_stats is not None:
        _not_supported("dispatch_wait_recv_cost_stats",
                       "ubep keeps no per-peer receive-wait timers")
    if use_ue8m0 and not round_scale:
        raise _ubep.InvalidArgument(
            "low_latency_dispatch: use_ue8m0=True needs round_scale=True (as DeepEP)")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise _ubep.InvalidArgument(
            f"low_latency_dispatch: x must be a [num_tokens, hidden] torch tensor, got "
            f"{getattr(x, 'shape', type(x).__name__)}")
    if topk_idx.dim() != 2:
        raise _ubep.InvalidArgument(
            f"low_latency_dispatch: topk_idx must be [num_tokens, num_topk], got "
            f"{tuple(topk_idx.shape)}")
    T, hidden, E = int(num_max_dispatch_tokens_per_rank), int(x.shape[1]), int(num_experts)
    dtype = "fp8" if use_fp8 else _value_dtype(x)
    nb = native(buf, dtype, bool(use_fp8 and round_scale), T, hidden, E, topk_idx.shape[1],
                buf._device_of(x))
    if fastable and nb.device == "cpu" and buf._group.num_hosts == 1:
        # Later calls of this shape take _fast_dispatch (the checks above hold for them: the
        # key has the same T, E, dtype, hidden, top-k and device).
        key = _fast_key(num_max_dispatch_tokens_per_rank, num_experts, x, topk_idx)
        buf._ll_fast[key] = _Fast(buf, nb, T, hidden, E, buf._event_factory)
    return _dispatch_on(buf, nb, x, topk_idx, T, hidden, E, cumulative_local_expert_recv_stats,
                        use_fp8, round_scale, use_ue8m0, return_recv_hook)


def _value_dtype(x):
    if x.dtype == torch.bfloat16:
        return "bf16"
    if x.dtype == torch.float32:
        return "fp32"
    raise _ubep.InvalidArgument(
        f"low_latency_dispatch: x must be torch.bfloat16 (or float32), got {x.dtype}")


def native(buf, dtype, pow2, T, hidden, E, k, device="cpu"):
    """The ubep.Buffer serving this low-latency shape and wire format, made on first use
    (collective: every rank makes the same calls) within num_rdma_bytes."""
    R = buf.group_size
    if E % R:
        raise _ubep.InvalidArgument(
            f"low_latency_dispatch: num_experts {E} is not a multiple of the {R} ranks")
    kcap = topk_capacity(k, 1)
    key = ("latency", dtype, pow2, T, hidden, E, kcap, device)
    nb = buf._natives.get(key)
    if nb is None:
        need = window_bytes(dtype, hidden, R, E // R, kcap, T, True)
        check_fits("low_latency_dispatch", need, "num_rdma_bytes", buf.num_rdma_bytes,
                   f"num_max_dispatch_tokens_per_rank={T}, hidden={hidden}, num_experts={E}, "
                   f"top-k up to {kcap}, {R} ranks, {dtype}")
        nb = buf._make_native(key, need, "num_rdma_bytes", buf.num_rdma_bytes,
                              max_tokens_per_rank=T, hidden=hidden, num_experts=E,
                              max_topk=kcap, dtype=dtype, enable_latency_layout=True,
                              fp8_round_scale=pow2, device=device)
    return nb


def fast_dispatch(buf, f, x, topk_idx, stats, round_scale):
    """_dispatch_on for a registered shape (_Fast): the dispatch and DeepEP's handle tensors in
    one native call, the same results."""
    nb = f.nb
    count = _empty(f.El, dtype=_int32)
    src_info = _empty((f.El, f.rows), dtype=_int32)
    layout_range = _empty((f.El, f.R), dtype=_int64)
    recv, hid = f.b.deep_ep_dispatch(x, topk_idx, TORCH, count, src_info, layout_range)
    h = _Handle(nb, hid, "latency", topk_idx, None, TORCH)
    if stats is not None:
        stats.add_(count.to(device=stats.device, dtype=stats.dtype))
    handle = LowLatencyHandle((src_info, layout_range, f.T, f.hidden, f.E))
    handle._native, handle._h = nb, h
    handle._replay = (x, topk_idx, False, round_scale)
    handle._combined = False
    handle._staging = None
    handle._fast = f
    buf._last[id(nb)] = h
    return recv, count, handle, f.event(), None


def _dispatch_on(buf, nb, x, topk_idx, T, hidden, E, stats, use_fp8, round_scale, use_ue8m0,
                 return_recv_hook):
    recv, count64, h, _, hook = nb.low_latency_dispatch(
        x, topk_idx, T, E, None, use_fp8, round_scale, use_ue8m0,
        return_recv_hook=return_recv_hook)
    El, R = nb.num_local_experts, buf.group_size
    dev = x.device  # DeepEP's tensors on the inputs' device
    count = torch.empty(El, dtype=torch.int32, device=dev)
    src_info = torch.empty((El, T * R), dtype=torch.int32, device=dev)
    layout_range = torch.empty((El, R), dtype=torch.int64, device=dev)

    host = not nb.device.startswith("cuda:")

    def finish():
        # DeepEP's formats, filled once the data is there (the hook, or now); in host memory
        # by one native call (the torch ops cost more than the copies: docs/DEEPEP.md).
        if host:
            nb._buf.deep_ep_layout(h.id, count, src_info, layout_range)
        else:
            count.copy_(count64)
            src_info.copy_(h.recv_src[..., 1])
            rr = h.recv_range.to(dev)
            torch.bitwise_or(rr[..., 0] << 32, rr[..., 1], out=layout_range)
        if stats is not None:
            stats.add_(count.to(device=stats.device, dtype=stats.dtype))

    handle = LowLatencyHandle((src_info, layout_range, T, hidden, E))
    handle._native, handle._h = nb, h
    handle._replay = (x, topk_idx, use_fp8, round_scale)
    handle._combined = False
    handle._staging = None
    buf._last[id(nb)] = h
    if return_recv_hook:
        def recv_hook():
            if hook is not None:
                hook()
            finish()
        return recv, count, handle, buf._event(), recv_hook
    finish()
    return recv, count, handle, buf._event(), None


def _check_handle(handle, what):
    if not isinstance(handle, LowLatencyHandle):
        raise _ubep.InvalidArgument(
            f"{what}: handle must be the tuple low_latency_dispatch returned, got "
            f"{type(handle).__name__}")


def _must_replay(buf, handle):
    """Whether the next combine of this handle replays its dispatch: the window holds a later
    dispatch's rows, or ubep.Buffer combines a dispatch only once there (CUDA devices, groups
    across hosts). Otherwise the last dispatch is combined again in place."""
    return (buf._last.get(id(handle._native)) is not handle._h
            or (handle._combined and not repeats(buf, handle._native)))


def repeats(buf, nb):
    """Whether ubep.Buffer nb combines one dispatch again (the cpu device, one host)."""
    return nb.device == "cpu" and buf._group.num_hosts == 1


def combine_buffer(buf, handle):
    _check_handle(handle, "get_next_low_latency_combine_buffer")
    if _must_replay(buf, handle):
        # The next combine replays the dispatch (see combine), from here.
        if handle._staging is None:
            handle._staging = torch.empty(
                (handle._native.num_local_experts, handle[0].shape[1], handle[3]),
                dtype=torch.bfloat16, device=handle[0].device)
        return handle._staging
    return handle._native.get_next_low_latency_combine_buffer(handle._h)


def combine(buf, x, topk_idx, topk_weights, handle, use_logfmt, zero_copy, return_recv_hook,
            out, combine_wait_recv_cost_stats):
    _check_handle(handle, "low_latency_combine")
    if use_logfmt:
        _not_supported("use_logfmt=True (LogFMT combine)",
                       "ubep combines in bf16 with an fp32 sum; pass use_logfmt=False")
    if combine_wait_recv_cost_stats is not None:
        _not_supported("combine_wait_recv_cost_stats",
                       "ubep keeps no per-peer receive-wait timers")
    nb, h = handle._native, handle._h
    # Across hosts the relay reduces each host's rows with the weights that came with the
    # dispatch (the C++ engine cannot replace them at combine), and DeepEP's dispatch has none:
    # replay the dispatch with the combine's weights (one more dispatch per combine).
    weights_now = topk_weights is not None and buf._group.num_hosts > 1
    if _must_replay(buf, handle) or weights_now:
        # Same tokens, same routing: the same rows in the same places.
        if zero_copy:
            x = handle._staging if handle._staging is not None else \
                nb.get_next_low_latency_combine_buffer(h)
            zero_copy = False
        rx, ridx, use_fp8, round_scale = handle._replay
        _, _, h, _, _ = nb.low_latency_dispatch(
            rx, ridx, handle[2], handle[4], None, use_fp8, round_scale, False,
            topk_weights=topk_weights.float().contiguous() if weights_now else None)
        handle._h, handle._staging = h, None
        buf._last[id(nb)] = h
    handle._combined = True
    if weights_now:
        topk_weights = None  # given to the replayed dispatch
    # DeepEP returns a new tensor each call (or `out`): ubep's combine writes into it.
    if out is None:
        rx = handle._replay[0]
        out = torch.empty((rx.shape[0], handle[3]),
                          dtype=torch.float32 if nb.dtype == "fp32" else torch.bfloat16,
                          device=rx.device)
    y, _, hook = nb.low_latency_combine(x, topk_idx, topk_weights, h, zero_copy=zero_copy,
                                        return_recv_hook=return_recv_hook, out=out)
    return y, buf._event(), hook if return_recv_hook else None


def size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
    """The bytes of a bf16 low-latency window for these shapes (top-k up to HINT_TOPK)."""
    return window_bytes("bf16", int(hidden), int(num_ranks),
                        int(num_experts) // int(num_ranks),
                        topk_capacity(min(HINT_TOPK, max(int(num_experts), 1)), 1),
                        int(num_max_dispatch_tokens_per_rank), True)
