"""ubep.Buffer: ubep's own API, the C++ ``ubep::Buffer`` from Python (docs/PYTHON.md).

    buf = ubep.Buffer(group, hidden=7168, num_experts=256, max_tokens_per_rank=128)
    r = buf.dispatch(x, topk_idx, topk_weights, layout="latency")
    ...  # experts on r.recv_x[e, :r.recv_count[e]] (compact placement)
    y = buf.combine(expert_out, r.handle)

Code written against DeepEP's API uses ``ubep.deep_ep.Buffer`` instead (docs/DEEPEP.md).

Results are views of ubep's memory, in the framework of the input (torch or NumPy):

* dispatch results (recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, recv_count,
  recv_src, recv_range) stay valid until the next dispatch on this Buffer;
* combine results until the next combine;
* a dispatch may be combined again (cpu device, one host) until the next dispatch;
* ``copy=True`` returns owned copies instead.

A view keeps the Buffer's memory mapped, so a stale view is never a crash, only stale data.
"""
from . import _arrays, _native, _ubep
from ._arrays import kind_of, owned


class Handle:
    """Identifies one dispatch for its combines (any number, until the next dispatch)."""

    __slots__ = ("id", "layout", "num_tokens", "_buffer", "_kind", "_combined",
                 "_combine_buffer", "_staging")

    def __init__(self, buffer, dispatch_id, layout, num_tokens, kind):
        self._buffer = buffer
        self.id = dispatch_id
        self.layout = layout
        self.num_tokens = num_tokens
        self._kind = kind
        self._combined = False  # combined at least once: combine_buffer is then _staging
        self._combine_buffer = None
        self._staging = None

    def __repr__(self):
        return f"<ubep.Handle dispatch {self.id} ({self.layout}, {self.num_tokens} tokens)>"


class DispatchResult:
    """What one dispatch received (C++ ``ubep::DispatchResult``); views valid until the next
    dispatch on the Buffer.

    * throughput layout: recv_x [rows, hidden], recv_topk_idx [rows, k] int32 local expert id or
      -1, recv_topk_weights [rows, k] fp32, recv_count [local_experts] int64;
    * latency layout: recv_x [local_experts, max_tokens * ranks, hidden], recv_count
      [local_experts] int64 (recv_topk_idx, recv_topk_weights: None);
    * fp8 buffers: recv_x holds e4m3 codes (torch.float8_e4m3fn where torch has it, else uint8)
      and recv_x_scales their fp32 scales, one row per row of recv_x (else None);
    * ``recv_src`` / ``recv_range``: see the properties; ``handle``: for combine.
    """

    __slots__ = ("recv_x", "recv_x_scales", "recv_topk_idx", "recv_topk_weights", "recv_count",
                 "handle", "_owned")

    def __init__(self, recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, recv_count,
                 handle, copies=None):
        self.recv_x = recv_x
        self.recv_x_scales = recv_x_scales
        self.recv_topk_idx = recv_topk_idx
        self.recv_topk_weights = recv_topk_weights
        self.recv_count = recv_count
        self.handle = handle
        self._owned = copies  # copy=True: (recv_src, recv_range), taken at dispatch

    @property
    def layout(self):
        return self.handle.layout

    @property
    def recv_src(self):
        """(source rank, source token) of every received row, int64: [rows, 2] (throughput) or
        [local_experts, max_tokens * ranks, 2] (latency). A view while this is the last dispatch
        on the Buffer (afterwards InvalidArgument), an owned copy with ``copy=True``."""
        if self._owned is not None:
            return self._owned[0]
        h = self.handle
        return h._buffer._window.view("recv_src", h.id, h._kind)

    @property
    def recv_range(self):
        """Where each source's rows are, int64 (begin, count): [local_experts, ranks, 2]
        (latency, row within recv_x[e]) or [ranks, 2] (throughput, row of recv_x). Compact
        placement: contiguous, in rank order; per-source: begin = source * max_tokens_per_rank.
        A view while this is the last dispatch on the Buffer, an owned copy with ``copy=True``."""
        if self._owned is not None:
            return self._owned[1]
        h = self.handle
        return h._buffer._window.view("recv_range", h.id, h._kind)

    def __repr__(self):
        return f"<ubep.DispatchResult of {self.handle!r}>"


class Buffer:
    """One rank's communication buffer (collective: every rank of the group makes it with the
    same arguments). ``group``: a ``ubep.Group`` (``run_on_threads``), a ``torch.distributed``
    process group, or an mpi4py communicator (across hosts: an mpi4py communicator under
    mpirun). ``timeout`` (s) and ``ranks_per_host`` (> 0: force hosts of that many ranks) apply
    when the Buffer makes the group from a framework group (``ubep.make_group``).

    ubep sizes the buffer by shape: ``hidden``, ``num_experts``, ``max_tokens_per_rank``,
    ``max_topk`` and ``dtype`` (torch.bfloat16 / torch.float32, "bf16" / "fp32"; NumPy bf16 is
    uint16 bits; or "fp8": dispatch moves e4m3 codes with per-128-channel fp32 scales, combine
    runs in bf16; ``fp8_round_scale=True`` rounds the scales ubep computes up to powers of two).
    ``enable_latency_layout=False`` leaves out the latency layout's memory.

    ``placement``: "compact" (default: recv_x[e, :recv_count[e]] are the rows of local expert
    e), "per-source" (source s's rows for expert e start at row s * max_tokens_per_rank, so
    senders never wait for each other's counts; see DispatchResult.recv_range) or "auto"
    (ubep's measured default: per-source for the latency layout).

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
        self._window = _native.make_window(
            self.group, hidden=hidden, num_experts=num_experts,
            max_tokens_per_rank=max_tokens_per_rank, max_topk=max_topk, dtype=dtype,
            algorithm=algorithm, num_workers=num_workers,
            enable_latency_layout=enable_latency_layout, sync=sync, placement=placement,
            fp8_round_scale=fp8_round_scale, device=device, mask_dead_ranks=mask_dead_ranks)
        self.rank = self.group.rank
        self.num_ranks = self.group.size
        self.hidden = int(hidden)
        self.num_experts = int(num_experts)
        self.max_tokens_per_rank = int(max_tokens_per_rank)
        self.num_local_experts = self._window.num_local_experts
        self.device = self._window.config()["device"]  # "cpu", "cuda:N" or "cuda-sim:N"
        self.dtype = _arrays.dtype_name(dtype)
        self.fp8_round_scale = bool(fp8_round_scale)
        self._last = None     # the Handle of the last dispatch (wait_recv_range, combine_recv)
        self._combining = None  # combine_send's (handle, out, direct, x) until combine_recv

    # --- dispatch ------------------------------------------------------------------------
    def _result(self, got, layout, num_tokens, kind, copy):
        recv_x, recv_idx, recv_w, recv_count, dispatch_id, recv_scales = got
        h = Handle(self, dispatch_id, layout, num_tokens, kind)
        self._last = h
        copies = None
        if copy:
            recv_x, recv_idx, recv_w = owned(recv_x), owned(recv_idx), owned(recv_w)
            recv_count, recv_scales = owned(recv_count), owned(recv_scales)
            copies = (owned(self._window.view("recv_src", dispatch_id, kind)),
                      owned(self._window.view("recv_range", dispatch_id, kind)))
        return DispatchResult(_native.recv_codes(recv_x, recv_scales), recv_scales, recv_idx,
                              recv_w, recv_count, h, copies)

    def _dispatch(self, x, topk_idx, topk_weights, x_scales, layout, send_only, what):
        latency = _native.is_latency(layout, what)
        kind = kind_of(x)
        x, x_scales, x_dtype = _native.x_args(x, x_scales, self.dtype, what)
        got = self._window.dispatch(x, topk_idx, topk_weights, latency, kind, send_only,
                                    x_scales, x_dtype)
        return got, kind, getattr(topk_idx, "shape", (0,))[0]

    def dispatch(self, x, topk_idx, topk_weights=None, *, x_scales=None, layout="throughput",
                 copy=False):
        """Sends each token of x [tokens, hidden] to the ranks of its experts (topk_idx [tokens,
        k] int64 global expert ids, -1 = none; topk_weights [tokens, k] fp32, or None: ones, the
        weights then come with the latency layout's combine). ``x_scales``: fp8 buffers given
        e4m3 codes (torch.float8_e4m3fn or uint8), their [tokens, ceil(hidden/128)] fp32 scales
        (without it, bf16/fp32 x is cast on send). ``layout``: "throughput" or "latency".
        Returns a DispatchResult (views until the next dispatch; ``copy=True``: owned)."""
        got, kind, n = self._dispatch(x, topk_idx, topk_weights, x_scales, layout, False,
                                      "dispatch")
        return self._result(got, layout, n, kind, copy)

    def dispatch_send(self, x, topk_idx, topk_weights=None, *, x_scales=None,
                      layout="throughput"):
        """The split phase (algorithm "ubep"; bsp: InvalidArgument): starts the dispatch (the
        arguments of ``dispatch``) and returns once this rank's messages are written; compute,
        then ``dispatch_recv()``. Returns the DispatchResult whose views ``dispatch_recv``
        fills, valid once it has returned (latency layout; a throughput result's row count is
        known only then: use dispatch_recv's). ``wait_recv_range`` waits for one source's rows
        in between."""
        got, kind, n = self._dispatch(x, topk_idx, topk_weights, x_scales, layout, True,
                                      "dispatch_send")
        return self._result(got, layout, n, kind, False)

    def dispatch_recv(self):
        """Completes ``dispatch_send``: returns its DispatchResult, the data there."""
        h = self._last
        if h is None:
            raise _ubep.InvalidArgument("dispatch_recv: no dispatch_send outstanding")
        got = self._window.dispatch_recv(h._kind)
        return self._result(got, h.layout, h.num_tokens, h._kind, False)

    def wait_recv_range(self, source, local_expert=0):
        """Between ``dispatch_send`` and ``dispatch_recv``: waits until the rows ``source``
        sends to ``local_expert`` (throughput: 0, all its rows) are in recv_x and returns their
        (begin, count). With placement="per-source" it waits for no other rank, so an expert can
        start on the sources that are there while a late rank is away."""
        if self._last is None:
            raise _ubep.InvalidArgument("wait_recv_range: no dispatch_send outstanding")
        return self._window.wait_recv_range(self._last.id, int(source), int(local_expert))

    # --- combine -------------------------------------------------------------------------
    def _own(self, handle, what):
        if not isinstance(handle, Handle):
            raise _ubep.InvalidArgument(
                f"{what}: handle must be the DispatchResult.handle of a dispatch, got "
                f"{type(handle).__name__}")
        # Dispatch numbers are per Buffer: another Buffer's handle could carry a valid-looking one.
        if handle._buffer is not self:
            raise _ubep.InvalidArgument(f"{what}: {handle!r} belongs to another Buffer")

    def combine_buffer(self, handle):
        """Where experts may write their outputs, shaped like recv_x, in ubep's shared memory:
        a combine of this array then reads them in place (zero copy). Valid until the next
        dispatch. Once the dispatch was combined, peers may still be reading that memory for
        the earlier combine, so this is then an owned array (holding what the window held) that
        combine copies from."""
        self._own(handle, "combine_buffer")
        if handle._combined:
            if handle._staging is None:
                handle._staging = owned(self._window.view("combine_buffer", handle.id,
                                                          handle._kind))
            return handle._staging
        if handle._combine_buffer is None:
            handle._combine_buffer = self._window.view("combine_buffer", handle.id, handle._kind)
        return handle._combine_buffer

    def combine(self, x, handle, topk_weights=None, *, out=None, copy=False):
        """Brings the expert outputs x (shaped like the dispatch's recv_x, combine dtype: the
        buffer's, bf16 for fp8) back to the tokens' ranks: y [tokens, hidden], y[t] = sum over
        selected k, ascending, of weight[t, k] * x[row of (t, k)] (fp32 accumulation, one
        rounding; throughput layout: x is already weighted and reduced per rank).
        ``topk_weights`` (latency layout, one host): the weights to apply instead of the
        dispatch's. ``out``: y goes there (returned). A view until the next combine
        (``copy=True``: owned)."""
        self._own(handle, "combine")
        kind = kind_of(x)
        direct = out is not None and self.device == "cpu"  # the reduction writes into out
        if direct:
            self._window.combine_into(x, handle.id, topk_weights, out)
            handle._combined = True
            return out
        y = self._window.combine(x, handle.id, topk_weights, kind, False, None)
        handle._combined = True
        if out is not None:
            return _arrays.copy_into(out, y)
        return owned(y) if copy else y

    def combine_send(self, x, handle, topk_weights=None, *, out=None):
        """The split phase of combine (algorithm "ubep"): starts it and returns once this rank's
        messages are written; ``combine_recv()`` returns y (x and out must stay alive until
        then). Arguments as ``combine``."""
        self._own(handle, "combine_send")
        kind = kind_of(x)
        direct = out is not None and self.device == "cpu"
        self._window.combine(x, handle.id, topk_weights, kind, True, out if direct else None)
        handle._combined = True
        self._combining = (kind, out, direct, x)
        return None

    def combine_recv(self):
        """Completes ``combine_send``: y (``out`` when it was given)."""
        if self._combining is None:
            raise _ubep.InvalidArgument("combine_recv: no combine_send outstanding")
        kind, out, direct, _ = self._combining
        self._combining = None
        y = self._window.combine_recv(kind)
        if out is None:
            return y
        return out if direct else _arrays.copy_into(out, y)

    # --- configuration -------------------------------------------------------------------
    @property
    def algorithm(self):
        """"ubep" (barrier-free) or "bsp" (staged, 3+2 barriers); settable between calls."""
        return self._window.algorithm

    @algorithm.setter
    def algorithm(self, name):
        self._window.set_algorithm(str(name))

    @property
    def shared_bytes(self):
        """The shared memory this rank's window takes (bytes)."""
        return self._window.shared_bytes

    def config(self):
        """The buffer's configuration as the library holds it (a dict)."""
        return self._window.config()

    def last_stats(self):
        """The last call: {"barriers", "stage_us": [(stage, us)...], "network_bytes",
        "network_rows"}."""
        return self._window.last_stats()

    # --- elastic EP (docs/ELASTIC.md; CPU buffers on one host, else InvalidArgument) -------
    def mask(self, rank):
        """From the next dispatch on, ``rank`` is neither sent to nor waited for, and top-k
        entries naming its experts are dropped (its experts contribute nothing). Call it on
        every surviving rank; a survivor that has not yet learns it at its next dispatch, where
        the live ranks agree on the mask. A call in flight when the group changes may fail with
        ``ubep.PeerFailedError`` naming the agreement; the next dispatch agrees. A rank out of
        range, or this rank: InvalidArgument naming it."""
        self._window.mask(int(rank))

    def masked_ranks(self):
        """The ranks masked in the view agreed at the last dispatch, ascending (a list)."""
        return list(self._window.masked_ranks())

    def rejoin(self):
        """This rank, masked while alive (or a replacement process), comes back: its next
        dispatch waits for and agrees with every live peer, which unmask it from that dispatch
        on (each sees it at a dispatch of its own). A masked rank that dispatches without
        rejoining gets ``ubep.PeerFailedError``, never data."""
        self._window.rejoin()

    # --- benchmark helpers (host memory: cpu and cuda-sim buffers) -----------------------
    def copy_recv_to_combine_buffer(self):
        """The benchmarks' identity expert: copies the last dispatch's received rows into its
        combine buffer (as ubep-bench does), in C++ without the GIL."""
        self._window.expert_identity()

    def time_calls(self, x, topk_idx, topk_weights, *, layout="throughput", iters=10, warmup=2,
                   barrier=True):
        """``warmup`` untimed then ``iters`` timed dispatch + identity expert + zero-copy
        combine, in a C++ loop without the GIL (``barrier``: a group barrier before each timed
        call): [(dispatch µs, combine µs), ...]."""
        latency = _native.is_latency(layout, "time_calls")
        return self._window.time_calls(x, topk_idx, topk_weights, latency, int(iters),
                                       int(warmup), bool(barrier))

    def baseline(self, exchange="default"):
        """The C++ all-to-all baseline on this buffer's group and shape: ``time_calls(x,
        topk_idx, topk_weights, latency, iters, warmup, barrier)`` and ``last_y()``.
        ``exchange="default"``: MPI_Alltoallv (a group from mpirun; ``ubep._ubep`` builds with
        MPI only); ``"oneccl"``: oneCCL's alltoallv on any group (an extension built with
        ``-DUBEP_ONECCL_ROOT``; ``ubep._ubep.has_oneccl``)."""
        return _ubep.Baseline(self._window, exchange)

