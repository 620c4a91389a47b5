"""The ubep windows under a ubep.deep_ep.Buffer, on the native layer (``_native``).

A deep_ep.Buffer holds one window per shape and wire format (DeepEP's byte budgets hold any
shape; a ubep window is made for one), each a native ``_ubep.Buffer`` with what this layer
reads per call (its dtype, device, sizes) and the last dispatch on it: ubep combines only a
window's last dispatch, so a DeepEP handle of an older one replays its dispatch first.
"""
import torch

from . import _arrays, _native, _ubep
from ._arrays import TORCH, owned


class Window:
    """One native window and its last dispatch (``last``, a Dispatch, or None)."""

    __slots__ = ("native", "dtype", "device", "num_local_experts", "max_tokens_per_rank",
                 "max_topk", "hidden", "repeats", "last")

    def __init__(self, native, num_hosts):
        cfg = native.config()
        self.native = native
        self.dtype = cfg["dtype"]
        self.device = cfg["device"]
        self.num_local_experts = native.num_local_experts
        self.max_tokens_per_rank = cfg["max_tokens_per_rank"]
        self.max_topk = cfg["max_topk"]
        self.hidden = cfg["hidden"]
        # Whether ubep combines one dispatch again in place (the cpu device, one host); else
        # a second combine replays the dispatch.
        self.repeats = self.device == "cpu" and num_hosts == 1
        self.last = None

    @property
    def combine_dtype(self):
        return torch.float32 if self.dtype == "fp32" else torch.bfloat16


class Dispatch:
    """One dispatch on a window: its native id, the topk_idx it routed (a combine given the
    same object skips the shape check), and its zero-copy combine input."""

    __slots__ = ("id", "topk_idx", "combined", "combine_buffer", "staging")

    def __init__(self, dispatch_id, topk_idx):
        self.id = dispatch_id
        self.topk_idx = topk_idx
        self.combined = False  # combined at least once: the combine buffer is then `staging`
        self.combine_buffer = None
        self.staging = None


def make(group, masked, **shape):
    """A window of ``shape`` (``_native.make_window``'s keywords) on ``group``, with the ranks
    in ``masked`` masked (a window made after a mask starts masked)."""
    w = Window(_native.make_window(group, **shape), group.num_hosts)
    for r in sorted(masked):
        w.native.mask(r)
    return w


def dispatch(w, x, topk_idx, topk_weights=None, *, latency, send_only=False, x_scales=None,
             what="dispatch"):
    """A dispatch on window ``w`` (torch tensors; fp8 windows: values cast on send, or codes with
    x_scales): ((recv_x or (codes, scales)), recv_topk_idx, recv_topk_weights, recv_count
    int64, Dispatch), views of the window; it becomes the window's last dispatch."""
    x, x_scales, x_dtype = _native.x_args(x, x_scales, w.dtype, what)
    recv_x, recv_idx, recv_w, count, dispatch_id, scales = w.native.dispatch(
        x, topk_idx, topk_weights, latency, TORCH, send_only, x_scales, x_dtype)
    d = Dispatch(dispatch_id, topk_idx)
    w.last = d
    recv = recv_x if scales is None else (_native.recv_codes(recv_x, scales), scales)
    return recv, recv_idx, recv_w, count, d


def view(w, which, d):
    """"recv_src", "recv_range" or "combine_buffer" of the window's last dispatch ``d``."""
    return w.native.view(which, d.id, TORCH)


def combine_buffer(w, d):
    """The zero-copy combine input of the last dispatch ``d`` (ubep.Buffer.combine_buffer's
    rule: once combined, an owned copy, since peers may still read the window)."""
    if d.combined:
        if d.staging is None:
            d.staging = owned(view(w, "combine_buffer", d))
        return d.staging
    if d.combine_buffer is None:
        d.combine_buffer = view(w, "combine_buffer", d)
    return d.combine_buffer


def combine(w, x, d, topk_weights, out, send_only=False):
    """Combines expert outputs x of the last dispatch ``d`` into ``out`` (a torch tensor).
    Returns out, or with send_only the hook that completes the call (x and out stay alive in
    it until then)."""
    direct = w.device == "cpu"  # the reduction writes straight into out
    d.combined = True
    if not send_only:
        if direct:
            w.native.combine_into(x, d.id, topk_weights, out)
            return out
        return _arrays.copy_into(out, w.native.combine(x, d.id, topk_weights, TORCH, False,
                                                       None))
    y = w.native.combine(x, d.id, topk_weights, TORCH, True, out if direct else None)
    native = w.native

    def hook(x=x, out=out):
        native.combine_recv(TORCH)
        if not direct:
            _arrays.copy_into(out, y)
    return hook


def check_budget(w, need, budget_name, budget, shape):
    """The window's real bytes against the byte budget it was made for."""
    real = w.native.shared_bytes
    if budget is not None and real > budget:
        raise _ubep.InvalidArgument(
            f"Buffer: ubep's window for {shape} takes {real} bytes per rank (estimated "
            f"{need}), more than {budget_name}={budget}")
