"""DeepEP's normal (throughput) dispatch and combine for ubep.deep_ep.Buffer (see deep_ep.py).

As DeepEP, results are new tensors (ubep's own results are views of its window, which the next
dispatch reuses). The handle is DeepEP's intranode 6-tuple:
  rank_prefix_matrix [ranks, ranks] int32: [i][j] = tokens ranks 0..i send to rank j;
  channel_prefix_matrix [ranks, 1] int32: zeros (ubep has no channels: one per rank);
  recv_channel_prefix_matrix [ranks, 1] int32: the first received row of each source;
  recv_src_idx [rows] int32: the source token of every received row;
  is_token_in_rank [tokens, ranks] bool;
  send_head [tokens, ranks] int32: the token's position among those sent to that rank, or -1.
"""
import numpy as np
import torch

from . import _arrays, _fp8, _native, _ubep
from . import _deep_ep_window as _win
from ._arrays import kind_of
from ._deep_ep_sizing import max_tokens_for, topk_capacity, window_bytes

FLOAT8 = getattr(torch, "float8_e4m3fn", None)  # None on torch < 2.1: codes stay uint8


class NormalHandle(tuple):
    """DeepEP's 6-tuple, carrying ubep's dispatch and what cached calls and combines of an
    older dispatch need."""


def _err(msg):
    raise _ubep.InvalidArgument(msg)


def _dtype_of(x, scales):
    if scales is not None:
        return "fp8"
    if x.dtype == torch.bfloat16:
        return "bf16"
    if x.dtype == torch.float32:
        return "fp32"
    if x.dtype == torch.uint8 or (FLOAT8 is not None and x.dtype == FLOAT8):
        _err("dispatch: fp8 x must come as a (codes, scales) tuple (as DeepEP)")
    _err(f"dispatch: x must be torch.bfloat16 (or float32), or an fp8 (codes, scales) tuple, "
         f"got {x.dtype}")


def window(buf, dtype, hidden, E, k, num_tokens, device="cpu"):
    """The window serving this normal-mode shape and wire format: its max_tokens_per_rank is
    what num_nvl_bytes holds (a budget, as DeepEP's), made on first use (collective)."""
    R = buf.group_size
    if E % R:
        _err(f"dispatch: num_experts {E} (num_tokens_per_expert) is not a multiple of the {R} "
             f"ranks")
    kcap = topk_capacity(k, R)
    key = ("throughput", dtype, hidden, E, kcap, device)
    nb = buf._windows.get(key)
    if nb is None:
        T = buf._max_tokens or max_tokens_for(buf.num_nvl_bytes, dtype, hidden, R, E // R, kcap)
        if T == 0:
            _err(f"dispatch: num_nvl_bytes={buf.num_nvl_bytes} does not hold one token per rank "
                 f"(hidden {hidden}, {dtype}, {R} ranks needs "
                 f"{window_bytes(dtype, hidden, R, E // R, kcap, 1, False)} bytes)")
        need = window_bytes(dtype, hidden, R, E // R, kcap, T, False)
        nb = buf._make_window(key, need, "num_nvl_bytes", buf.num_nvl_bytes,
                              max_tokens_per_rank=T, hidden=hidden, num_experts=E, max_topk=kcap,
                              dtype=dtype, enable_latency_layout=False, device=device)
    if num_tokens > nb.max_tokens_per_rank:
        T = nb.max_tokens_per_rank
        _err(f"dispatch: {num_tokens} tokens exceed the {T} tokens per rank that "
             f"num_nvl_bytes={buf.num_nvl_bytes} holds for hidden {hidden} ({dtype}, {R} ranks; "
             f"{num_tokens} tokens need "
             f"{window_bytes(dtype, hidden, R, E // R, kcap, num_tokens, False)} bytes)")
    return nb


def _aux(buf, name, hidden, T, E, k, device):
    """A small fp32 side window (outside the byte budget): the count exchange and the
    combine of top-k weights."""
    key = ("aux", name, hidden, T, E, k, device)
    nb = buf._windows.get(key)
    if nb is None:
        nb = buf._make_window(key, None, None, None, max_tokens_per_rank=T, hidden=hidden,
                              num_experts=E, max_topk=k, dtype="fp32",
                              enable_latency_layout=False, device=device)
    return nb


def _allgather(buf, vec):
    """Every rank's int vector [n] -> [ranks, n] int64: one token routed to every rank."""
    R = buf.group_size
    nb = _aux(buf, "allgather", vec.numel(), 1, R, topk_capacity(R, R), buf._device_of(vec))
    route = torch.arange(R, dtype=torch.int64, device=vec.device).view(1, R)
    rows = _win.dispatch(nb, vec.to(torch.float32).view(1, -1), route, latency=False)[0]
    return rows.to(torch.int64)  # exact: counts are far below 2**24


def _route(E, R, is_token_in_rank):
    """A dispatch without topk_idx: one column per rank, its first expert where the token goes."""
    dev = is_token_in_rank.device
    first = torch.arange(R, dtype=torch.int64, device=dev) * (E // R)
    return torch.where(is_token_in_rank, first.view(1, R),
                       torch.full((1, R), -1, dtype=torch.int64, device=dev))


def _owned_recv(nb, d, recv_x):
    """New tensors holding dispatch d's received rows recv_x (DeepEP returns new tensors). In
    host memory the native layer copies them into memory it maps with huge pages where the
    kernel offers them: a torch clone of a prefill's rows (~120 MB) ran at ~1 GB/s on the
    project's VMs, faulting its pages in one by one (docs/PERFORMANCE.md, issue 31, 28th
    session). GPU windows: a torch copy in GPU memory."""
    if nb.device.startswith("cuda:"):
        return (recv_x[0].clone(), recv_x[1].clone()) if isinstance(recv_x, tuple) \
            else recv_x.clone()
    values, scales = nb.native.owned_recv(d.id)
    return values if scales is None else (_fp8.codes_out(values), scales)


def dispatch(buf, x, handle, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
             topk_idx, topk_weights, expert_alignment, num_worst_tokens):
    values, scales = (x[0], x[1]) if isinstance(x, (tuple, list)) else (x, None)
    if scales is not None and not scales.is_contiguous():
        scales = scales.contiguous()  # DeepEP's scales are often column-major
    xin = (values, scales)
    dtype, hidden = _dtype_of(values, scales), int(values.shape[-1])
    if handle is not None:  # cached dispatch: the handle's routing again
        if not isinstance(handle, NormalHandle):
            _err(f"dispatch: handle must be the tuple dispatch returned, got "
                 f"{type(handle).__name__}")
        if topk_idx is not None or topk_weights is not None:
            _err("dispatch: a cached dispatch (handle=) takes no topk_idx/topk_weights "
                 "(as DeepEP)")
        route, nb = handle._route, handle._window
        if nb.dtype != dtype or nb.hidden != hidden or nb.device != buf._device_of(values):
            nb = window(buf, dtype, hidden, handle._E, route.shape[1], route.shape[0],
                        buf._device_of(values))
        if nb.device == "cpu":  # one native call: the dispatch and its rows made new
            x, x_scales, x_dtype = _native.x_args(values, scales, nb.dtype, "dispatch")
            recv_x, recv_scales, dispatch_id = nb.native.deep_ep_cached_dispatch(
                x, x_scales, x_dtype, route)
            d = nb.last = _win.Dispatch(dispatch_id, route)
            if recv_scales is not None:
                recv_x = (_fp8.codes_out(recv_x), recv_scales)
        else:
            recv_x, _, _, _, d = _win.dispatch(nb, values, route, latency=False, x_scales=scales)
            recv_x = _owned_recv(nb, d, recv_x)
        _remember(handle, nb, d, xin)
        return recv_x, None, None, None, None, buf._event()

    if num_tokens_per_rank is None or is_token_in_rank is None or num_tokens_per_expert is None:
        _err("dispatch: without a handle, num_tokens_per_rank, is_token_in_rank and "
             "num_tokens_per_expert are required (get_dispatch_layout gives them)")
    if (topk_idx is None) != (topk_weights is None):
        _err("dispatch: pass topk_idx and topk_weights together (or neither)")
    R, E = buf.group_size, int(num_tokens_per_expert.numel())
    if buf._device_of(values) == "cpu":
        k = R if topk_idx is None else int(topk_idx.shape[-1])
        nb = window(buf, dtype, hidden, E, k, values.shape[0], "cpu")
        return _native_dispatch(buf, nb, xin, topk_idx, topk_weights, is_token_in_rank,
                                num_tokens_per_rank, num_tokens_per_expert, E, expert_alignment,
                                num_worst_tokens)
    if tuple(is_token_in_rank.shape) != (values.shape[0], R):
        _err(f"dispatch: is_token_in_rank must be [{values.shape[0]}, {R}], got "
             f"{tuple(is_token_in_rank.shape)}")
    given = is_token_in_rank.to(torch.bool)
    if topk_idx is not None:
        route = topk_idx
        _, _, want_expert, in_rank = get_dispatch_layout(topk_idx, E, R)
        if not torch.equal(in_rank, given):
            t = int((in_rank != given).any(dim=1).nonzero()[0])
            _err(f"dispatch: is_token_in_rank row {t} marks ranks "
                 f"{given[t].nonzero().view(-1).tolist()}, topk_idx row {t} goes to ranks "
                 f"{in_rank[t].nonzero().view(-1).tolist()}")
        _check_counts(num_tokens_per_expert, want_expert, "num_tokens_per_expert",
                      "topk_idx routes {} tokens to expert {}")
    else:
        route = _route(E, R, given.to(device=values.device))
    _check_counts(num_tokens_per_rank, given.sum(dim=0), "num_tokens_per_rank",
                  "is_token_in_rank marks {} tokens for rank {}")
    nb = window(buf, dtype, hidden, E, route.shape[1], route.shape[0], buf._device_of(values))
    recv_x, recv_idx, recv_w, _, d = _win.dispatch(nb, values, route, topk_weights,
                                                   latency=False, x_scales=scales)
    recv_x = _owned_recv(nb, d, recv_x)
    recv_src_idx = _win.view(nb, "recv_src", d)[:, 1].to(torch.int32)
    begins = _win.view(nb, "recv_range", d)[:, 0].to(torch.int32).view(R, 1)
    # The counts every rank sends (DeepEP's notify step): each rank's rank_prefix_matrix row
    # and its tokens per expert, for the whole matrix and the per-expert list.
    local = torch.cat([num_tokens_per_rank.to(torch.int64).view(-1),
                       num_tokens_per_expert.to(torch.int64).view(-1)])
    gathered = _allgather(buf, local)
    rank_prefix_matrix = gathered[:, :R].cumsum(0).to(torch.int32)
    El = E // R
    per_expert = gathered[:, R + buf.rank * El:R + (buf.rank + 1) * El].sum(0).tolist()
    a = max(int(expert_alignment), 1)
    counts = [-(-int(c) // a) * a for c in per_expert]
    in_rank = is_token_in_rank.to(torch.bool)
    send_head = torch.where(in_rank, in_rank.to(torch.int32).cumsum(0) - 1,
                            torch.full_like(in_rank, -1, dtype=torch.int32)).to(torch.int32)
    handle = NormalHandle((rank_prefix_matrix,
                           torch.zeros((R, 1), dtype=torch.int32, device=values.device), begins,
                           recv_src_idx, in_rank, send_head))
    handle._route, handle._E = route, E
    _remember(handle, nb, d, xin)
    recv_topk_idx = recv_idx.to(torch.int64) if topk_idx is not None else None
    recv_topk_weights = recv_w.clone() if topk_idx is not None else None
    if num_worst_tokens:
        recv_x, recv_topk_idx, recv_topk_weights = _pad(
            recv_x, recv_topk_idx, recv_topk_weights, int(num_worst_tokens))
        counts = []
    return recv_x, recv_topk_idx, recv_topk_weights, counts, handle, buf._event()


def _int32(a):
    """DeepEP's int32 counts as the native call reads them (int64 ones converted)."""
    return a if a.dtype is torch.int32 and a.is_contiguous() else \
        a.to(torch.int32).contiguous()


def _native_dispatch(buf, nb, xin, topk_idx, topk_weights, is_token_in_rank, per_rank, per_expert,
                     E, alignment, num_worst_tokens):
    """dispatch on a host window in one native call (PyBuffer::deep_ep_normal_dispatch): the
    layout checks, the dispatch, the count exchange and DeepEP's results, made new."""
    R = buf.group_size
    x, x_scales, x_dtype = _native.x_args(xin[0], xin[1], nb.dtype, "dispatch")
    in_rank = is_token_in_rank if is_token_in_rank.dtype is torch.bool else \
        is_token_in_rank.to(torch.bool)
    counts = _aux(buf, "allgather", R + E, 1, R, topk_capacity(R, R), "cpu")
    try:
        recv_x, scales, recv_idx, recv_w, per_expert_list, prefix, channel_prefix, begins, \
            src_idx, send_head, route, dispatch_id = nb.native.deep_ep_normal_dispatch(
                counts.native, x, x_scales, x_dtype, topk_idx, topk_weights,
                in_rank.contiguous().view(torch.uint8),  # torch < 2 exports no bool (DLPack)
                _int32(per_rank), _int32(per_expert), int(alignment))
    except BaseException:
        if nb.last is not None and nb.native.last_dispatch != nb.last.id:
            # Failed past its dispatch (the count exchange): the window's last dispatch is
            # none of the handles', so each replays its own before a combine (never an older
            # one combined in place). Failed checks leave the last dispatch as it was.
            nb.last = None
        raise
    if route is None:
        route = topk_idx
    d = _win.Dispatch(dispatch_id, route)
    nb.last = d
    if scales is not None:
        recv_x = (_fp8.codes_out(recv_x), scales)
    handle = NormalHandle((prefix, channel_prefix, begins, src_idx, in_rank, send_head))
    handle._route, handle._E = route, E
    _remember(handle, nb, d, xin)
    if num_worst_tokens:
        recv_x, recv_idx, recv_w = _pad(recv_x, recv_idx, recv_w, int(num_worst_tokens))
        per_expert_list = []
    return recv_x, recv_idx, recv_w, per_expert_list, handle, buf._event()


def _check_counts(given, want, name, what):
    """The layout's counts against the routing's (the native path's checks, for GPU windows)."""
    if given.numel() != want.numel():
        _err(f"dispatch: {name} must have {want.numel()} entries, got {tuple(given.shape)}")
    given, want = given.view(-1).to(device=want.device, dtype=torch.int64), want.to(torch.int64)
    if not torch.equal(given, want):
        i = int((given != want).nonzero()[0])
        _err(f"dispatch: {name}[{i}] is {int(given[i])}, " + what.format(int(want[i]), i))


def _remember(handle, w, d, xin):
    handle._window, handle._dispatch, handle._x = w, d, xin


def _pad(recv_x, idx, w, n):
    """DeepEP's num_worst_tokens: results padded to n rows (idx -1 beyond the received ones)."""
    rows = (recv_x[0] if isinstance(recv_x, tuple) else recv_x).shape[0]
    if rows > n:
        _err(f"dispatch: {rows} received rows exceed num_worst_tokens={n}")

    def pad(a, fill):
        if a is None:
            return None
        out = torch.full((n,) + tuple(a.shape[1:]), fill, dtype=a.dtype, device=a.device)
        out[:rows] = a
        return out
    if isinstance(recv_x, tuple):
        recv_x = (pad(recv_x[0].view(torch.uint8) if FLOAT8 is not None else recv_x[0], 0),
                  pad(recv_x[1], 0))
        if FLOAT8 is not None:
            recv_x = (recv_x[0].view(FLOAT8), recv_x[1])
    else:
        recv_x = pad(recv_x, 0)
    return recv_x, pad(idx, -1), pad(w, 0)


def combine(buf, x, handle, topk_weights, bias):
    if not isinstance(handle, NormalHandle):
        _err(f"combine: handle must be the tuple dispatch returned, got {type(handle).__name__}")
    if topk_weights is not None and topk_weights.dim() != 2:
        _err(f"combine: topk_weights must be [received rows, k], got {tuple(topk_weights.shape)}")
    nb, d = handle._window, handle._dispatch
    if nb.last is not d or (d.combined and not nb.repeats):
        # ubep combines only the last dispatch (a later one reused the window), and on CUDA
        # devices or across hosts only once: then replay this handle's dispatch (same rows,
        # same places) first.
        # Otherwise the last one is combined again in place (ubep's repeated combine).
        values, scales = handle._x
        d = _win.dispatch(nb, values, handle._route, latency=False, x_scales=scales)[4]
        handle._dispatch = d
    d.combined = True
    biases = [b for b in (bias if isinstance(bias, (tuple, list)) else (bias,)) if b is not None]
    if not biases and nb.device == "cpu":
        # A new tensor made natively (huge pages where offered; see _owned_recv), the
        # reduction writing into it: no copy of a view, no 4 KiB page faults. With topk_weights
        # the weights' combine follows in the same native call.
        if topk_weights is None:
            return nb.native.combine_new(x, d.id, None), None, buf._event()
        wnb = _weights_window(buf, handle, topk_weights)
        y, weights, weights_id = nb.native.deep_ep_normal_combine(
            x, d.id, wnb.native, handle._route, _fp32(topk_weights))
        wnb.last = _win.Dispatch(weights_id, handle._route)
        wnb.last.combined = True
        return y, weights, buf._event()
    y = nb.native.combine(x, d.id, None, _arrays.TORCH, False, None)
    if biases:  # added to the sum in fp32, one rounding
        acc = y.to(torch.float32)
        for b in biases:
            acc = acc + b.to(torch.float32)
        y = acc.to(y.dtype)
    else:
        y = y.clone()
    weights = None
    if topk_weights is not None:
        weights = _combine_weights(buf, handle, topk_weights)
    return y, weights, buf._event()


def _combine_weights(buf, handle, topk_weights):
    """DeepEP's combined_topk_weights: per token, the sum over the ranks it went to of the
    weights each passed back (fp32, ascending rank order): a combine of the weights as rows."""
    route, nb = handle._route, _weights_window(buf, handle, topk_weights)
    k = int(topk_weights.shape[-1])
    d = _win.dispatch(nb, torch.zeros((route.shape[0], k), dtype=torch.float32,
                                      device=route.device), route, latency=False)[4]
    d.combined = True
    return nb.native.combine(topk_weights.to(torch.float32).contiguous(), d.id, None,
                             _arrays.TORCH, False, None).clone()


def _weights_window(buf, handle, topk_weights):
    """The fp32 side window combining top-k weights [rows, k] of handle's dispatches."""
    w, k = handle._window, int(topk_weights.shape[-1])
    return _aux(buf, "weights", k, w.max_tokens_per_rank, handle._E, w.max_topk, w.device)


def _fp32(a):
    """a as the native call reads it: float32, contiguous."""
    return a if a.dtype is torch.float32 and a.is_contiguous() else \
        a.to(torch.float32).contiguous()


def get_dispatch_layout(topk_idx, num_experts, num_ranks):
    """DeepEP's layout from topk_idx [tokens, k] (-1 = none): (num_tokens_per_rank [ranks],
    None, num_tokens_per_expert [experts], is_token_in_rank [tokens, ranks] bool), int32 counts,
    torch or NumPy like topk_idx. """
    kind = kind_of(topk_idx)
    if kind == _arrays.TORCH:
        if topk_idx.dtype is torch.int64 and topk_idx.device.type == "cpu" and \
                type(topk_idx) is torch.Tensor and topk_idx.dim() == 2:
            # One native pass (the torch ops took ~150 us for a handful of tokens)
            per_rank, per_expert, in_rank = _ubep.deep_ep_dispatch_layout(
                topk_idx, num_experts, num_ranks)
            return per_rank, None, per_expert, in_rank.view(torch.bool)
        return _arrays.dispatch_layout_torch(topk_idx, num_experts, num_ranks)  # its device
    idx = np.from_dlpack(topk_idx) if kind != _arrays.NUMPY else topk_idx
    idx = np.asarray(idx, dtype=np.int64)
    if num_experts % num_ranks:
        raise _ubep.InvalidArgument(
            f"get_dispatch_layout: num_experts {num_experts} is not a multiple of the "
            f"{num_ranks} ranks")
    bad = (idx < -1) | (idx >= num_experts)
    if bad.any():
        raise _ubep.InvalidArgument(
            f"get_dispatch_layout: expert id {int(idx[bad][0])} outside [-1, {num_experts})")
    valid = idx >= 0
    per_expert = np.bincount(idx[valid], minlength=num_experts).astype(np.int32)
    in_rank = np.zeros((idx.shape[0], num_ranks), dtype=bool)
    rows, _ = np.nonzero(valid)
    in_rank[rows, idx[valid] // (num_experts // num_ranks)] = True
    per_rank = in_rank.sum(axis=0).astype(np.int32)
    return per_rank, None, per_expert, in_rank
