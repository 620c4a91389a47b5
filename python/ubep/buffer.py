"""ubep.Buffer: DeepEP's Buffer API over ubep's dispatch and combine (docs/PYTHON.md).

Results are views of ubep's memory, in the framework of the input (torch or NumPy):

* dispatch results (recv_x, recv_topk_idx, recv_topk_weights, recv_count) stay valid until the
  next dispatch on this Buffer;
* combine results until the next combine;
* a dispatch may be combined again (DeepEP's tests combine one dispatch twice) until the next
  dispatch;
* ``copy=True`` returns owned copies instead.

A view keeps the Buffer's memory mapped, so a stale view is never a crash, only stale data.
"""
from . import _arrays, _fp8, _ubep
from ._arrays import kind_of, owned


class EventOverlap:
    """DeepEP's event handle. Calls finish before they return on the CPU, so there is nothing to
    wait for: the methods exist so DeepEP code runs unchanged."""

    def current_stream_wait(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_EVENT = EventOverlap()


class Handle:
    """Identifies one dispatch for its combines (any number, until the next dispatch), and keeps
    the routing for a cached dispatch (``dispatch(x, handle=h)``)."""

    __slots__ = ("id", "layout", "topk_idx", "topk_weights", "kind", "_buffer",
                 "_combine_buffer", "_combined", "_staging")

    def __init__(self, buffer, hid, layout, topk_idx, topk_weights, kind):
        self._buffer = buffer
        self.id = hid
        self.layout = layout
        self.topk_idx = topk_idx
        self.topk_weights = topk_weights
        self.kind = kind
        self._combine_buffer = None
        self._combined = False  # combined at least once: zero-copy input goes to _staging
        self._staging = None

    @property
    def num_tokens(self):
        return self.topk_idx.shape[0]

    @property
    def recv_src(self):
        """(source rank, source token) of every received row: [rows, 2] (throughput) or
        [local_experts, max_tokens * ranks, 2] (latency), int64. Only while this is the last
        dispatch on the Buffer."""
        return self._buffer._buf.view("recv_src", self.id, self.kind)

    @property
    def recv_range(self):
        """Where each source's rows are (DeepEP's packed_recv_layout_range), int64 (begin,
        count): [local_experts, ranks, 2] (latency, row within recv_x[e]) or [ranks, 2]
        (throughput). Only while this is the last dispatch on the Buffer."""
        return self._buffer._buf.view("recv_range", self.id, self.kind)

    def wait_recv_range(self, source, local_expert=0):
        """The receive hook per piece, between a ``return_recv_hook=True`` dispatch and its
        hook(): waits until the rows ``source`` sends to ``local_expert`` (throughput: 0, all its
        rows) are in recv_x and returns their (begin, count). With placement="per-source" it
        waits for no other rank, so an expert can start on the sources that are there while a
        late rank is away."""
        return self._buffer._buf.wait_recv_range(self.id, int(source), int(local_expert))

    def __repr__(self):
        return f"<ubep.Handle dispatch {self.id} ({self.layout}, {self.num_tokens} tokens)>"


def _no_hook():
    pass


def _own(buffer, handle, what):
    # Dispatch numbers are per Buffer: another Buffer's handle could carry a valid-looking one.
    if handle._buffer is not buffer:
        raise _ubep.InvalidArgument(f"{what}: {handle!r} belongs to another Buffer")


class Buffer:
    """One rank's communication buffer (collective: every rank of the group makes it with the
    same arguments). ``group``: a ``ubep.Group`` (``run_on_threads``), a ``torch.distributed``
    process group, or an mpi4py communicator (across hosts: an mpi4py communicator under
    mpirun). ``timeout`` (s) and ``ranks_per_host`` (> 0: force hosts of that many ranks) apply
    when the Buffer makes the group from a framework group (``ubep.make_group``).

    Unlike DeepEP's byte budgets, ubep sizes the buffer by shape: ``hidden``, ``num_experts``,
    ``max_tokens_per_rank`` (DeepEP's num_max_dispatch_tokens_per_rank), ``max_topk`` and
    ``dtype`` (torch.bfloat16 / torch.float32, "bf16" / "fp32"; NumPy bf16 is uint16 bits; or
    "fp8": dispatch moves e4m3 codes with per-128-channel fp32 scales, combine runs in bf16;
    ``fp8_round_scale=True`` rounds the scales ubep computes up to powers of two).

    ``placement``: "compact" (default, DeepEP's packing: recv_x[e, :recv_count[e]] are the
    rows of local expert e), "per-source" (source s's rows for expert e start at row
    s * max_tokens_per_rank, so senders never wait for each other's counts; see
    Handle.recv_range) or "auto" (ubep's measured default: per-source for the latency layout).

    ``device``: where the arrays live and so which backend runs (docs/PYTHON.md, Devices): "cpu"
    (default), "cuda" / "cuda:N" / a torch.device (CUDA tensors, the CUDA kernels; results are
    CUDA tensors), or "cuda-sim[:N]" (the CUDA kernels simulated on CPU threads: host arrays,
    thread ranks only; for tests).

    ``mask_dead_ranks=True`` (elastic EP, docs/ELASTIC.md; CPU buffers on one host): a rank
    whose process died is masked at the next dispatch, as if every survivor called ``mask``.
    ``elastic_name`` (when the Buffer makes the group from a framework group, as
    ``ubep.make_group``): the group's name on the host, under which a replacement process
    joins with ``ubep.make_rejoin_group(elastic_name, rank)``.
    """

    def __init__(self, group, *, hidden, num_experts, max_tokens_per_rank=128, max_topk=8,
                 dtype="bf16", algorithm="ubep", num_workers=-1, enable_latency_layout=True,
                 sync="fused", placement="compact", timeout=60.0, fp8_round_scale=False,
                 device="cpu", ranks_per_host=0, mask_dead_ranks=False, elastic_name=""):
        from .groups import as_group  # late: groups imports torch.distributed lazily
        self.group = as_group(group, timeout=timeout, ranks_per_host=ranks_per_host,
                              elastic_name=elastic_name)
        self._buf = _ubep.Buffer(self.group, int(max_tokens_per_rank), int(hidden),
                                 _arrays.dtype_name(dtype), int(num_experts), int(max_topk),
                                 str(algorithm), int(num_workers), bool(enable_latency_layout),
                                 str(sync), str(placement), bool(fp8_round_scale),
                                 _arrays.device_name(device), bool(mask_dead_ranks))
        self.rank = self.group.rank
        self.num_ranks = self.group.size
        self.hidden = int(hidden)
        self.num_experts = int(num_experts)
        self.max_tokens_per_rank = int(max_tokens_per_rank)
        self.num_local_experts = self._buf.num_local_experts
        self.device = self._buf.config()["device"]  # "cpu", "cuda:N" or "cuda-sim:N"
        self.dtype = _arrays.dtype_name(dtype)
        self.fp8_round_scale = bool(fp8_round_scale)

    def _x_args(self, x, what):
        """(x, x_scales, x_dtype) for the extension: an fp8 (codes, scales) tuple, or values (cast
        on send when the buffer is fp8)."""
        if isinstance(x, tuple):
            if len(x) != 2:
                raise _ubep.InvalidArgument(
                    f"{what}: an fp8 x is a (codes, scales) tuple, got {len(x)} items")
            if self.dtype != "fp8":
                raise _ubep.InvalidArgument(
                    f"{what}: x is an fp8 (codes, scales) tuple but the buffer's dtype is "
                    f"{self.dtype}; make the Buffer with dtype='fp8'")
            return _fp8.codes_in(x[0], what + ": x[0]"), x[1], ""
        return x, None, (_fp8.cast_dtype(x) if self.dtype == "fp8" else "")

    def _fp8_recv(self, recv_x, scales, use_ue8m0):
        """recv_x as DeepEP returns it from an fp8 dispatch: (codes, scales)."""
        if scales is None:
            return recv_x
        if use_ue8m0:
            scales = _fp8.pack_ue8m0(scales)
        return _fp8.codes_out(recv_x), scales

    # --- configuration -------------------------------------------------------------------
    @property
    def algorithm(self):
        """"ubep" (barrier-free) or "bsp" (staged, 3+2 barriers); settable between calls."""
        return self._buf.algorithm

    @algorithm.setter
    def algorithm(self, name):
        self._buf.set_algorithm(str(name))

    def config(self):
        return self._buf.config()

    def last_stats(self):
        """The last call: {"barriers", "stage_us": [(stage, us)...], "network_bytes",
        "network_rows"}."""
        return self._buf.last_stats()

    # --- elastic EP (docs/ELASTIC.md; CPU buffers on one host, else InvalidArgument) -------
    def mask(self, rank):
        """From the next dispatch on, ``rank`` is neither sent to nor waited for, and top-k
        entries naming its experts are dropped (its experts contribute nothing). Call it on
        every surviving rank (DeepEP's low_latency_update_mask_buffer); a survivor that has not
        yet learns it at its next dispatch, where the live ranks agree on the mask. A call in
        flight when the group changes may fail with ``ubep.PeerFailedError`` naming the
        agreement; the next dispatch agrees. A rank out of range, or this rank: InvalidArgument
        naming it."""
        self._buf.mask(int(rank))

    def masked_ranks(self):
        """The ranks masked in the view agreed at the last dispatch, ascending (a list)."""
        return list(self._buf.masked_ranks())

    def rejoin(self):
        """This rank, masked while alive (or a replacement process), comes back: its next
        dispatch waits for and agrees with every live peer, which unmask it from that dispatch
        on (each sees it at a dispatch of its own). A masked rank that dispatches without
        rejoining gets ``ubep.PeerFailedError``, never data."""
        self._buf.rejoin()

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank=None, hidden=None,
                                 num_experts=None):
        """DeepEP zeroes its receive flags between uses; ubep's messages carry epoch tags, so
        there is nothing to clean. Kept so DeepEP code runs unchanged."""

    @staticmethod
    def set_num_sms(num_sms):
        """DeepEP's GPU SM budget; no meaning on the CPU (ubep: num_workers=)."""

    # --- throughput layout (DeepEP "normal") ---------------------------------------------
    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        """(num_tokens_per_rank [ranks], None, num_tokens_per_expert [experts],
        is_token_in_rank [tokens, ranks] bool, event) as DeepEP; counts are int32."""
        return get_dispatch_layout(topk_idx, num_experts, self.num_ranks) + (_EVENT,)

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment=1, num_worst_tokens=0, config=None,
                 previous_event=None, async_finish=False, allocate_on_comm_stream=False, *,
                 copy=False):
        """Throughput-layout dispatch. Returns (recv_x [rows, hidden], recv_topk_idx [rows, k]
        int32 local expert ids or -1, recv_topk_weights [rows, k] fp32,
        num_recv_tokens_per_expert_list, handle, event). The layout arguments are accepted for
        DeepEP compatibility and not needed: ubep routes from topk_idx. With ``handle`` and no
        topk_idx, the handle's routing is dispatched again (DeepEP's cached dispatch)."""
        kind = kind_of(x[0] if isinstance(x, tuple) else x)
        x, x_scales, x_dtype = self._x_args(x, "dispatch")
        if topk_idx is None:
            if handle is None:
                raise _ubep.InvalidArgument("dispatch: topk_idx is required (or a handle to reuse)")
            _own(self, handle, "dispatch")
            topk_idx, topk_weights = handle.topk_idx, handle.topk_weights
        recv_x, recv_idx, recv_w, recv_count, hid, recv_scales = self._buf.dispatch(
            x, topk_idx, topk_weights, False, kind, False, x_scales, x_dtype)
        counts = [int(c) for c in recv_count.tolist()]
        if expert_alignment > 1:
            counts = [-(-c // expert_alignment) * expert_alignment for c in counts]
        h = Handle(self, hid, "throughput", topk_idx, topk_weights, kind)
        if copy:
            recv_x, recv_idx, recv_w = owned(recv_x), owned(recv_idx), owned(recv_w)
            recv_scales = owned(recv_scales)
        return self._fp8_recv(recv_x, recv_scales, False), recv_idx, recv_w, counts, h, _EVENT

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                async_finish=False, allocate_on_comm_stream=False, *, copy=False):
        """Throughput-layout combine: x [rows, hidden] holds, per received row, the weighted sum
        of the rank's local experts. Returns (combined_x [tokens, hidden], combined_topk_weights,
        event); combined_topk_weights is the dispatch's topk_weights when topk_weights is given
        (what DeepEP's reduction of unchanged recv_topk_weights yields), else None."""
        _own(self, handle, "combine")
        y = self._buf.combine(x, handle.id, None, kind_of(x), False)
        handle._combined = True
        if bias is not None:
            for b in (bias if isinstance(bias, (tuple, list)) else (bias,)):
                if b is not None:
                    y = y + b
        elif copy:
            y = owned(y)
        return y, (handle.topk_weights if topk_weights is not None else None), _EVENT

    # --- latency layout (DeepEP "low latency") -------------------------------------------
    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None, use_fp8=False,
                             round_scale=False, use_ue8m0=False, async_finish=False,
                             return_recv_hook=False, *, topk_weights=None, copy=False):
        """Returns (recv_x [local_experts, max_tokens * ranks, hidden], recv_count
        [local_experts] int64, handle, event, hook). With return_recv_hook=True the call only
        sends: recv_x and recv_count are filled once hook() returns (the split phase; compute
        in between). ``topk_weights`` may be given here or to low_latency_combine."""
        if num_max_dispatch_tokens_per_rank != self.max_tokens_per_rank:
            raise _ubep.InvalidArgument(
                f"low_latency_dispatch: num_max_dispatch_tokens_per_rank "
                f"{num_max_dispatch_tokens_per_rank} differs from the buffer's "
                f"max_tokens_per_rank {self.max_tokens_per_rank}")
        if num_experts != self.num_experts:
            raise _ubep.InvalidArgument(
                f"low_latency_dispatch: num_experts {num_experts} differs from the buffer's "
                f"{self.num_experts}")
        # The wire format is fixed when the Buffer is made (its windows are sized for it).
        if bool(use_fp8) != (self.dtype == "fp8"):
            raise _ubep.InvalidArgument(
                f"low_latency_dispatch: use_fp8={bool(use_fp8)} but the buffer's dtype is "
                f"{self.dtype}; make the Buffer with dtype='fp8' for use_fp8=True")
        if use_fp8 and bool(round_scale) != self.fp8_round_scale:
            raise _ubep.InvalidArgument(
                f"low_latency_dispatch: round_scale={bool(round_scale)} but the buffer was made "
                f"with fp8_round_scale={self.fp8_round_scale}")
        if use_ue8m0 and not (use_fp8 and round_scale):
            raise _ubep.InvalidArgument(
                "low_latency_dispatch: use_ue8m0=True needs use_fp8=True and round_scale=True "
                "(UE8M0 holds powers of two only)")
        kind = kind_of(x[0] if isinstance(x, tuple) else x)
        x, x_scales, x_dtype = self._x_args(x, "low_latency_dispatch")
        split = return_recv_hook and self._buf.algorithm == "ubep"
        recv_x, _, _, recv_count, hid, scales = self._buf.dispatch(
            x, topk_idx, topk_weights, True, kind, split, x_scales, x_dtype)
        h = Handle(self, hid, "latency", topk_idx, topk_weights, kind)
        stats = cumulative_local_expert_recv_stats
        if not split:
            if stats is not None:
                _arrays.accumulate(stats, recv_count)
            if copy:
                recv_x, recv_count, scales = owned(recv_x), owned(recv_count), owned(scales)
            return (self._fp8_recv(recv_x, scales, use_ue8m0), recv_count, h, _EVENT,
                    _no_hook if return_recv_hook else None)

        buf = self._buf
        if use_ue8m0:  # packed from the scales once they are there; filled in by the hook
            packed = _fp8.pack_ue8m0(owned(scales))

        def hook(x=x, topk_idx=topk_idx, x_scales=x_scales):  # inputs live until the call ends
            buf.dispatch_recv(kind)
            if stats is not None:
                _arrays.accumulate(stats, recv_count)
            if use_ue8m0:
                _arrays.copy_into(packed, _fp8.pack_ue8m0(scales))

        recv = (_fp8.codes_out(recv_x), packed if use_ue8m0 else scales) if use_fp8 else recv_x
        return recv, recv_count, h, _EVENT, hook

    def get_next_low_latency_combine_buffer(self, handle):
        """Where experts may write their outputs, shaped like recv_x, in ubep's shared memory:
        low_latency_combine(..., zero_copy=True) then reads them in place. Valid until the next
        dispatch. Once the dispatch was combined, peers may still be reading that memory for
        the earlier combine, so this is then an owned array (holding what the window held) that
        a zero_copy combine copies from."""
        _own(self, handle, "get_next_low_latency_combine_buffer")
        if handle._combined:
            if handle._staging is None:
                handle._staging = owned(self._buf.view("combine_buffer", handle.id, handle.kind))
            return handle._staging
        if handle._combine_buffer is None:
            handle._combine_buffer = self._buf.view("combine_buffer", handle.id, handle.kind)
        return handle._combine_buffer

    # The throughput layout has the same zero-copy input ([rows, hidden]; pass it to combine).
    get_next_combine_buffer = get_next_low_latency_combine_buffer

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False,
                            zero_copy=False, async_finish=False, return_recv_hook=False,
                            out=None, *, copy=False):
        """y[t] = sum over selected k, ascending, of topk_weights[t, k] * x[expert, slot]
        (fp32 accumulation, one rounding). Returns (combined_x [tokens, hidden], event, hook).
        topk_idx must be the dispatch's (ubep routes with what it saw at dispatch)."""
        _own(self, handle, "low_latency_combine")
        if zero_copy:
            x = self.get_next_low_latency_combine_buffer(handle)
        if (topk_idx is not None and topk_idx is not handle.topk_idx
                and tuple(topk_idx.shape) != tuple(handle.topk_idx.shape)):
            raise _ubep.InvalidArgument(
                f"low_latency_combine: topk_idx shape {tuple(topk_idx.shape)} differs from the "
                f"dispatch's {tuple(handle.topk_idx.shape)}")
        w = None if topk_weights is None or topk_weights is handle.topk_weights else topk_weights
        kind = kind_of(x)
        split = return_recv_hook and self._buf.algorithm == "ubep"
        # On the cpu the reduction writes straight into `out` (no copy); elsewhere y is copied.
        direct = out is not None and self.device == "cpu"
        y = self._buf.combine(x, handle.id, w, kind, split, out if direct else None)
        handle._combined = True
        if direct:
            y = out
        if split:
            buf = self._buf

            def hook(x=x, out=out):  # the input (and out) stay alive until the call completes
                buf.combine_recv(kind)
                if out is not None and not direct:
                    _arrays.copy_into(out, y)

            return (out if out is not None else y), _EVENT, hook
        if out is not None and not direct:
            y = _arrays.copy_into(out, y)
        elif copy and out is None:
            y = owned(y)
        return y, _EVENT, _no_hook if return_recv_hook else None


def get_dispatch_layout(topk_idx, num_experts, num_ranks):
    """DeepEP's layout from topk_idx [tokens, k] (-1 = none): (num_tokens_per_rank [ranks],
    None, num_tokens_per_expert [experts], is_token_in_rank [tokens, ranks] bool), int32 counts,
    torch or NumPy like topk_idx."""
    import numpy as np
    kind = kind_of(topk_idx)
    if kind == _arrays.TORCH:  # on the tensor's device
        return _arrays.dispatch_layout_torch(topk_idx, num_experts, num_ranks)
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
    if kind == _arrays.TORCH:
        torch = _arrays.torch
        return (torch.from_numpy(per_rank), None, torch.from_numpy(per_expert),
                torch.from_numpy(in_rank))
    return per_rank, None, per_expert, in_rank
