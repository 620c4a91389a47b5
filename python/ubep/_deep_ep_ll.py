"""DeepEP's low-latency dispatch and combine for ubep.deep_ep.Buffer (see deep_ep.py).

Results as DeepEP shapes them: recv_x (or (codes, scales) with fp8) is a view of ubep's window,
valid for the next two dispatches as in DeepEP ("you cannot hold more than 2 low-latency
kernels' result tensors"); recv_count is int32; the handle is the tuple (src_info [local
experts, max_tokens * ranks] int32 source token, layout_range [local experts, ranks] int64
``begin << 32 | count``, num_max_dispatch_tokens_per_rank, hidden, num_experts); combined_x is
a new tensor (or ``out``).
"""
import torch

from . import _deep_ep_window as _win
from . import _fp8, _ubep
from ._arrays import TORCH, copy_into, owned
from ._deep_ep_sizing import HINT_TOPK, check_fits, topk_capacity, window_bytes



class LowLatencyHandle(tuple):
    """DeepEP's 5-tuple, carrying ubep's dispatch (``_window``, ``_dispatch``: the window and
    its _deep_ep_window.Dispatch) and what a combine of an older dispatch needs to replay it
    (``_replay``: x, topk_idx, use_fp8)."""


def _not_supported(what, why):
    raise NotImplementedError(f"ubep.deep_ep: {what} is not supported ({why})")


class _Fast:
    """What the common call of one shape needs, found once (the per-call Python work is most of
    ubep.deep_ep's cost over the native API: docs/DEEPEP.md, Performance): a dispatch without
    UE8M0 scales on a cpu window of one host (bf16, fp32, or fp8 cast on send; with or without
    a receive hook), and its combines."""

    __slots__ = ("window", "native", "local_experts", "rows", "ranks", "max_tokens", "hidden",
                 "num_experts", "topk", "fp8", "pow2", "x_dtype", "out_dtype", "event")

    def __init__(self, buf, w, max_tokens, hidden, num_experts, topk, fp8, pow2, x_dtype,
                 event):
        self.window, self.native = w, w.native
        self.local_experts, self.ranks = w.num_local_experts, buf.group_size
        self.rows = max_tokens * self.ranks
        self.max_tokens, self.hidden, self.num_experts = max_tokens, hidden, num_experts
        self.topk = topk  # the exact top-k of the shape (the native call checks it)
        # use_fp8 and round_scale as the window serves them, and what x holds on an fp8 window
        # ("bf16" or "fp32", cast on send; "" otherwise: the window's dtype)
        self.fp8, self.pow2, self.x_dtype = fp8, pow2, x_dtype
        self.out_dtype = w.combine_dtype
        self.event = event  # makes an EventOverlap (not a bound method of buf: no cycle)


def fast_key(max_tokens, num_experts, x, topk_idx, fp8, pow2):
    """The registered shapes' key. Only 2-D x and topk_idx were ever registered: other shapes
    miss and take the checks."""
    return (max_tokens, num_experts, x.dtype, x.shape[1:], topk_idx.shape[1:], x.is_cpu, fp8,
            pow2)


def dispatch(buf, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
             cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats, use_fp8,
             round_scale, use_ue8m0, return_recv_hook):
    # deep_ep.Buffer.low_latency_dispatch takes the native fast path for a registered shape.
    fastable = not use_ue8m0 and dispatch_wait_recv_cost_stats is None
    if dispatch_wait_recv_cost_stats is not None:
        _not_supported("dispatch_wait_recv_cost_stats",
                       "ubep keeps no per-peer receive-wait timers")
    if use_ue8m0 and not (use_fp8 and round_scale):
        raise _ubep.InvalidArgument(
            "low_latency_dispatch: use_ue8m0=True needs use_fp8=True and round_scale=True "
            "(as DeepEP: UE8M0 holds powers of two only)")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise _ubep.InvalidArgument(
            f"low_latency_dispatch: x must be a [num_tokens, hidden] torch tensor, got "
            f"{getattr(x, 'shape', type(x).__name__)}")
    if topk_idx.dim() != 2:
        raise _ubep.InvalidArgument(
            f"low_latency_dispatch: topk_idx must be [num_tokens, num_topk], got "
            f"{tuple(topk_idx.shape)}")
    T, hidden, E = int(num_max_dispatch_tokens_per_rank), int(x.shape[1]), int(num_experts)
    # fp8: what x holds, to cast on send (InvalidArgument for other dtypes, as the send's own
    # check would raise, but before the shape is registered below)
    x_dtype = _fp8.cast_dtype(x) if use_fp8 else ""
    dtype = "fp8" if use_fp8 else _value_dtype(x)
    fp8, pow2 = bool(use_fp8), bool(use_fp8) and bool(round_scale)
    w = window(buf, dtype, pow2, T, hidden, E, topk_idx.shape[1], buf._device_of(x))
    if fastable and w.device == "cpu" and buf._group.num_hosts == 1:
        # Later calls of this shape take the fast path (the checks above hold for them: the
        # key has the same T, E, dtype, hidden, top-k, device and wire format).
        key = fast_key(num_max_dispatch_tokens_per_rank, num_experts, x, topk_idx, fp8, pow2)
        buf._ll_fast[key] = _Fast(buf, w, T, hidden, E, int(topk_idx.shape[1]), fp8, pow2,
                                  x_dtype, buf._event_factory)
    return _dispatch_on(buf, w, x, topk_idx, T, hidden, E, cumulative_local_expert_recv_stats,
                        use_fp8, use_ue8m0, return_recv_hook)


def _value_dtype(x):
    if x.dtype == torch.bfloat16:
        return "bf16"
    if x.dtype == torch.float32:
        return "fp32"
    raise _ubep.InvalidArgument(
        f"low_latency_dispatch: x must be torch.bfloat16 (or float32), got {x.dtype}")


def window(buf, dtype, pow2, T, hidden, E, k, device="cpu"):
    """The window serving this low-latency shape and wire format, made on first use
    (collective: every rank makes the same calls) within num_rdma_bytes."""
    R = buf.group_size
    if E % R:
        raise _ubep.InvalidArgument(
            f"low_latency_dispatch: num_experts {E} is not a multiple of the {R} ranks")
    kcap = topk_capacity(k, 1)
    key = ("latency", dtype, pow2, T, hidden, E, kcap, device)
    w = buf._windows.get(key)
    if w is None:
        need = window_bytes(dtype, hidden, R, E // R, kcap, T, True)
        check_fits("low_latency_dispatch", need, "num_rdma_bytes", buf.num_rdma_bytes,
                   f"num_max_dispatch_tokens_per_rank={T}, hidden={hidden}, num_experts={E}, "
                   f"top-k up to {kcap}, {R} ranks, {dtype}")
        w = buf._make_window(key, need, "num_rdma_bytes", buf.num_rdma_bytes,
                             max_tokens_per_rank=T, hidden=hidden, num_experts=E,
                             max_topk=kcap, dtype=dtype, enable_latency_layout=True,
                             fp8_round_scale=pow2, device=device)
    return w


def _new_handle(w, d, src_info, layout_range, T, hidden, E, replay):
    handle = LowLatencyHandle((src_info, layout_range, T, hidden, E))
    handle._window, handle._dispatch, handle._replay = w, d, replay
    handle._staging = None
    return handle


def fast_dispatch(f, x, topk_idx, stats, hook):
    """A registered shape's dispatch (_Fast f) in one native call that makes DeepEP's handle
    tensors too, returned as _dispatch_on returns them; None when x or topk_idx are not of that
    shape (nothing done then). hook: DeepEP's return_recv_hook (the receive and the handle
    tensors' values come with the hook; with the bsp algorithm all of it is done already)."""
    split = hook and f.native.algorithm == "ubep"
    got = f.native.deep_ep_dispatch(x, topk_idx, f.topk, f.x_dtype, split)
    if got is None:
        return None
    recv, scales, count, src_info, layout_range, dispatch_id = got
    if scales is not None:  # fp8: (codes, scales)
        recv = (_fp8.codes_out(recv), scales)
    d = _win.Dispatch(dispatch_id, topk_idx)
    f.window.last = d
    handle = LowLatencyHandle((src_info, layout_range, f.max_tokens, f.hidden, f.num_experts))
    handle._window, handle._dispatch, handle._replay = f.window, d, (x, topk_idx, f.fp8)
    handle._staging = None
    handle._fast = f
    if hook:
        native = f.native

        def recv_hook(x=x, topk_idx=topk_idx):  # the inputs live until the call ends
            if split:
                native.deep_ep_dispatch_recv()
            if stats is not None:
                stats.add_(count.to(device=stats.device, dtype=stats.dtype))
        return recv, count, handle, f.event(), recv_hook
    if stats is not None:
        stats.add_(count.to(device=stats.device, dtype=stats.dtype))
    return recv, count, handle, f.event(), None


def combine_hook(native, x, out):
    """The hook of a fast combine's split phase (x and out stay alive in it until then)."""
    def hook(x=x, out=out):
        native.combine_finish()
    return hook


def _dispatch_on(buf, w, x, topk_idx, T, hidden, E, stats, use_fp8, use_ue8m0,
                 return_recv_hook):
    split = return_recv_hook and w.native.algorithm == "ubep"
    recv, _, _, count64, d = _win.dispatch(w, x, topk_idx, latency=True, send_only=split,
                                           what="low_latency_dispatch")
    unpacked = None  # split: the scales view the hook packs once the data is there
    if use_fp8 and use_ue8m0:  # DeepEP's packed scales
        codes, scales = recv
        recv = (codes, _fp8.pack_ue8m0(owned(scales) if split else scales))
        unpacked = scales if split else None
    El, R = w.num_local_experts, buf.group_size
    dev = x.device  # DeepEP's tensors on the inputs' device
    count = torch.empty(El, dtype=torch.int32, device=dev)
    src_info = torch.empty((El, T * R), dtype=torch.int32, device=dev)
    layout_range = torch.empty((El, R), dtype=torch.int64, device=dev)
    host = not w.device.startswith("cuda:")

    def finish():
        # DeepEP's formats, filled once the data is there (the hook, or now); in host memory
        # by one native call (the torch ops cost more than the copies: docs/DEEPEP.md).
        if host:
            w.native.deep_ep_layout(d.id, count, src_info, layout_range)
        else:
            count.copy_(count64)
            src_info.copy_(_win.view(w, "recv_src", d)[..., 1])
            rr = _win.view(w, "recv_range", d).to(dev)
            torch.bitwise_or(rr[..., 0] << 32, rr[..., 1], out=layout_range)
        if stats is not None:
            stats.add_(count.to(device=stats.device, dtype=stats.dtype))

    handle = _new_handle(w, d, src_info, layout_range, T, hidden, E, (x, topk_idx, use_fp8))
    if return_recv_hook:
        def recv_hook(x=x, topk_idx=topk_idx):  # the inputs live until the call ends
            if split:
                w.native.dispatch_recv(TORCH)
                if unpacked is not None:
                    copy_into(recv[1], _fp8.pack_ue8m0(unpacked))
            finish()
        return recv, count, handle, buf._event(), recv_hook
    finish()
    return recv, count, handle, buf._event(), None


def _check_handle(handle, what):
    if not isinstance(handle, LowLatencyHandle):
        raise _ubep.InvalidArgument(
            f"{what}: handle must be the tuple low_latency_dispatch returned, got "
            f"{type(handle).__name__}")


def _must_replay(handle):
    """Whether the next combine of this handle replays its dispatch: the window holds a later
    dispatch's rows, or ubep combines a dispatch only once there (CUDA devices, groups across
    hosts). Otherwise the last dispatch is combined again in place."""
    w, d = handle._window, handle._dispatch
    return w.last is not d or (d.combined and not w.repeats)


def combine_buffer(buf, handle):
    _check_handle(handle, "get_next_low_latency_combine_buffer")
    if _must_replay(handle):
        # The next combine replays the dispatch (see combine), from here.
        if handle._staging is None:
            handle._staging = torch.empty(
                (handle._window.num_local_experts, handle[0].shape[1], handle[3]),
                dtype=torch.bfloat16, device=handle[0].device)
        return handle._staging
    return _win.combine_buffer(handle._window, handle._dispatch)


def combine(buf, x, topk_idx, topk_weights, handle, use_logfmt, zero_copy, return_recv_hook,
            out, combine_wait_recv_cost_stats):
    _check_handle(handle, "low_latency_combine")
    if use_logfmt:
        _not_supported("use_logfmt=True (LogFMT combine)",
                       "ubep combines in bf16 with an fp32 sum; pass use_logfmt=False")
    if combine_wait_recv_cost_stats is not None:
        _not_supported("combine_wait_recv_cost_stats",
                       "ubep keeps no per-peer receive-wait timers")
    w, d = handle._window, handle._dispatch
    # Across hosts the relay reduces each host's rows with the weights that came with the
    # dispatch (the C++ engine cannot replace them at combine), and DeepEP's dispatch has none:
    # replay the dispatch with the combine's weights (one more dispatch per combine).
    weights_now = topk_weights is not None and buf._group.num_hosts > 1
    if _must_replay(handle) or weights_now:
        # Same tokens, same routing: the same rows in the same places.
        if zero_copy:
            x = handle._staging if handle._staging is not None else _win.combine_buffer(w, d)
            zero_copy = False
        rx, ridx, _ = handle._replay
        weights = topk_weights.float().contiguous() if weights_now else None
        d = _win.dispatch(w, rx, ridx, weights, latency=True, what="low_latency_combine")[4]
        handle._dispatch, handle._staging = d, None
    if weights_now:
        topk_weights = None  # given to the replayed dispatch
    if zero_copy:
        x = _win.combine_buffer(w, d)
    if (topk_idx is not None and topk_idx is not d.topk_idx
            and tuple(topk_idx.shape) != tuple(d.topk_idx.shape)):
        raise _ubep.InvalidArgument(
            f"low_latency_combine: topk_idx shape {tuple(topk_idx.shape)} differs from the "
            f"dispatch's {tuple(d.topk_idx.shape)}")
    # DeepEP returns a new tensor each call (or `out`): ubep's combine writes into it.
    if out is None:
        rx = handle._replay[0]
        out = torch.empty((rx.shape[0], handle[3]), dtype=w.combine_dtype, device=rx.device)
    split = return_recv_hook and w.native.algorithm == "ubep"
    if split:
        return out, buf._event(), _win.combine(w, x, d, topk_weights, out, send_only=True)
    _win.combine(w, x, d, topk_weights, out)
    return out, buf._event(), _no_hook if return_recv_hook else None


def _no_hook():
    pass


def copy_recv_to_combine_buffer(handle):
    """ubep.bench's identity expert for a deep_ep handle: the received rows of its dispatch
    copied into the window's combine buffer, in C++ (host memory)."""
    _check_handle(handle, "copy_recv_to_combine_buffer")
    handle._window.native.expert_identity()


def size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
    """The bytes of a bf16 low-latency window for these shapes (top-k up to HINT_TOPK)."""
    return window_bytes("bf16", int(hidden), int(num_ranks),
                        int(num_experts) // int(num_ranks),
                        topk_capacity(min(HINT_TOPK, max(int(num_experts), 1)), 1),
                        int(num_max_dispatch_tokens_per_rank), True)
