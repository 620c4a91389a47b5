"""DeepEP's V1 Python API (``deep_ep.Buffer``, DeepEP's deep_ep/buffers/legacy.py) on ubep.

    import ubep.deep_ep as deep_ep
    buffer = deep_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes, low_latency_mode=True, ...)

Code written for DeepEP runs unchanged on CPU tensors, and on CUDA tensors where ubep has its
CUDA backend (bf16/fp32; ubep-only ``device=``, docs/PYTHON.md "Devices"). What maps to what,
and what differs, is docs/DEEPEP.md. In short:

* Bytes are a budget: normal mode gets the tokens per rank that ``num_nvl_bytes`` holds, low
  latency checks that ``num_rdma_bytes`` holds the call's shape; an error says what does not fit.
  Each wire format (bf16, fp32, fp8, fp8 with power-of-two scales) and mode has its own ubep
  window, made on its first call (every rank makes the same calls, as DeepEP requires).
* Calls finish before they return (or at ``hook()``): events are complete at once.
* The mask API (``enable_shrink``, low_latency_*_mask_buffer) is ubep's elastic EP
  (docs/ELASTIC.md; CPU windows on one host): a masked rank comes back by its own
  ``rejoin()`` (ubep-only), not by unmasking it here.

It is built on ubep's native layer (``_native``, ``_deep_ep_window``), as ``ubep.Buffer`` is;
new code that wants ubep's own features (split phase, placement, masks) uses ``ubep.Buffer``
(docs/PYTHON.md).
* What ubep does not do raises ``NotImplementedError`` naming it: LogFMT combine,
  receive-wait cost statistics, raw buffer tensors, CUDA streams.
"""
import functools

import torch

from . import _deep_ep_ll as _ll
from . import _deep_ep_normal as _normal
from . import _deep_ep_window as _win
from . import _arrays, _ubep
from .groups import as_group

topk_idx_t = torch.int64


class EventOverlap:
    """DeepEP's event wrapper. ubep's calls complete before they return, so every event is
    already complete: waiting returns at once (after the hook registered to run after it)."""

    # What __init__ sets, as class defaults: the hot paths make events without running
    # __init__ (_new_event: one C call instead of a Python frame), with the same attributes.
    event = None
    extra_tensors = None
    hook_after_wait = None

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors
        self.hook_after_wait = None

    def current_stream_wait(self, release_handle=False):
        if self.hook_after_wait is not None:
            hook, self.hook_after_wait = self.hook_after_wait, None
            hook()
        if release_handle:
            self.event = None

    def register_hook_after_wait(self, hook_after_wait):
        assert self.hook_after_wait is None, "A hook is already registered on this `EventOverlap`"
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle=False):
        """``with event(release_handle=True):`` as DeepEP."""
        self._release_on_exit = release_handle
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current_stream_wait(getattr(self, "_release_on_exit", False))
        return False


# EventOverlap() without its __init__ frame: an instance whose attributes are the defaults.
_new_event = functools.partial(object.__new__, EventOverlap)


class Config:
    """DeepEP's performance config (SMs and chunk sizes of its channels). ubep has no channels;
    the values are kept and validated, and the size hints say what ubep needs."""

    # The tokens per rank get_nvl_buffer_size_hint sizes for: DeepEP's normal mode streams
    # through fixed channel buffers, ubep's window holds a whole call (ubep-bench's prefill).
    hint_tokens_per_rank = 4096

    def __init__(self, num_sms=20, num_max_nvl_chunked_send_tokens=6,
                 num_max_nvl_chunked_recv_tokens=256, num_max_rdma_chunked_send_tokens=6,
                 num_max_rdma_chunked_recv_tokens=256):
        if num_sms <= 0 or num_sms % 2:
            raise ValueError(f"Config: num_sms must be positive and even, got {num_sms}")
        self.num_sms = int(num_sms)
        self.num_max_nvl_chunked_send_tokens = int(num_max_nvl_chunked_send_tokens)
        self.num_max_nvl_chunked_recv_tokens = int(num_max_nvl_chunked_recv_tokens)
        self.num_max_rdma_chunked_send_tokens = int(num_max_rdma_chunked_send_tokens)
        self.num_max_rdma_chunked_recv_tokens = int(num_max_rdma_chunked_recv_tokens)

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        """num_nvl_bytes for hint_tokens_per_rank tokens of hidden_bytes (bf16) per rank, top-k
        up to 8 and up to 1024 experts per rank."""
        from ._deep_ep_sizing import topk_capacity, window_bytes
        return window_bytes("bf16", int(hidden_bytes) // 2, int(num_ranks), 1024,
                            topk_capacity(8, num_ranks), self.hint_tokens_per_rank, False)

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        """0: ubep's Python groups are on one host, normal mode needs only num_nvl_bytes."""
        return 0

    def __repr__(self):
        return (f"Config({self.num_sms}, {self.num_max_nvl_chunked_send_tokens}, "
                f"{self.num_max_nvl_chunked_recv_tokens}, {self.num_max_rdma_chunked_send_tokens}"
                f", {self.num_max_rdma_chunked_recv_tokens})")


class Buffer:
    """DeepEP's Buffer on ubep (collective: every rank makes it with the same arguments).

    ``group``: a torch.distributed process group (gloo), or ``comm=``, an mpi4py communicator;
    a ``ubep.Group`` (thread ranks) works too. ubep-only keywords: ``algorithm`` ("ubep" or
    "bsp"), ``num_workers``, ``timeout`` (s), ``max_tokens_per_rank`` (normal mode: use this
    instead of what num_nvl_bytes holds; still checked against the budget), ``device`` (where
    ubep's windows live, as ``ubep.Buffer(device=...)``; None, the default: the device of each
    call's input tensors -- cpu, or cuda:N for CUDA tensors; "cuda-sim[:N]" runs the simulated
    CUDA backend on CPU tensors). Tensors this layer makes are on the inputs' device."""

    num_sms = 20
    _event_factory = _new_event  # a partial, not a function: no bound method

    def __init__(self, group=None, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False,
                 num_qps_per_rank=24, allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False,
                 explicitly_destroy=False, enable_shrink=False, comm=None, *, algorithm="ubep",
                 num_workers=-1, timeout=60.0, max_tokens_per_rank=None, device=None):
        if group is None and comm is None:
            raise ValueError("Either 'group' or 'comm' must be provided.")
        for name, v in (("num_nvl_bytes", num_nvl_bytes), ("num_rdma_bytes", num_rdma_bytes)):
            if int(v) < 0:
                raise _ubep.InvalidArgument(f"Buffer: {name} must be >= 0, got {v}")
        if low_latency_mode and num_qps_per_rank <= 0:
            raise _ubep.InvalidArgument(
                f"Buffer: num_qps_per_rank must be > 0 in low-latency mode, got "
                f"{num_qps_per_rank}")
        self.group = group if group is not None else comm
        self._group = as_group(self.group, timeout=timeout)
        self.rank = self._group.rank
        self.group_size = self._group.size
        self.num_nvl_bytes = int(num_nvl_bytes)
        self.num_rdma_bytes = int(num_rdma_bytes)
        self.low_latency_mode = bool(low_latency_mode)
        self.explicitly_destroy = bool(explicitly_destroy)
        # DeepEP's shrink mode: the mask API is in use, and a rank whose process died is masked
        # instead of failing every later call (ubep's mask_dead_ranks, one host).
        self.enable_shrink = bool(enable_shrink)
        self._masked = set()  # ranks masked on this rank: applied to natives made later too
        self._seen = set()    # those of them a dispatch has agreed (see _masked_now)
        self._algorithm, self._num_workers, self._timeout = algorithm, num_workers, timeout
        self._max_tokens = int(max_tokens_per_rank) if max_tokens_per_rank else None
        self._device = None if device is None else _arrays.device_name(device)
        self._windows = {}  # shape and wire format -> _deep_ep_window.Window
        self._ll_fast = {}  # low-latency call shape -> _deep_ep_ll._Fast (its checks passed)
        self._ll_hot = None  # the _Fast of the last call that took it
        # DeepEP's C++ runtime; None once destroyed. Not `self`: a reference cycle would leave
        # the windows to the garbage collector, which may free every thread rank's buffer on one
        # thread (a CUDA-backend buffer's teardown waits for its peers: a hang).
        self.runtime = object()

    # --- life cycle ----------------------------------------------------------------------
    def _device_of(self, t):
        """The device of the ubep window serving input tensor ``t``: the Buffer's ``device``,
        else t's (cpu, or cuda:N)."""
        if self._device is not None:
            return self._device
        if t.is_cpu:  # the common case, without building a device name per call
            return "cpu"
        return _arrays.device_name(t.device)

    def _make_window(self, key, need, budget_name, budget, **shape):
        # shape includes device=: each device (and so each key) has its own window
        w = _win.make(self._group, self._masked_now(), algorithm=self._algorithm,
                      num_workers=self._num_workers, placement="compact",
                      mask_dead_ranks=self.enable_shrink, **shape)
        _win.check_budget(w, need, budget_name, budget, shape)
        self._windows[key] = w
        return w

    def _live(self, what):
        if self.runtime is None:
            raise _ubep.InvalidArgument(f"{what}: the Buffer was destroyed")

    def _event(self):
        return _new_event()

    def destroy(self):
        """Releases ubep's windows (results still in use keep theirs until dropped)."""
        assert self.explicitly_destroy, '`explicitly_destroy` flag must be set'
        for w in self._windows.values():
            w.last = None  # a handle's window no longer serves it (the fast combine checks)
        self._windows.clear()
        self._ll_fast.clear()
        self._ll_hot = None
        self.runtime = None

    def is_available(self):
        return self.runtime is not None

    # --- static helpers ------------------------------------------------------------------
    @staticmethod
    def is_sm90_compiled():
        """True: what DeepEP gates on SM90 builds (fp8 normal dispatch) is available."""
        return True

    @staticmethod
    def set_num_sms(new_num_sms):
        """DeepEP's SM budget for normal kernels; kept for the config getters (ubep's workers
        are the ``num_workers`` keyword)."""
        assert new_num_sms % 2 == 0, 'The SM count must be even'
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture():
        """An event on the "current stream": complete at once (calls finish before returning)."""
        return EventOverlap()

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks,
                                       num_experts):
        """num_rdma_bytes that one low-latency shape needs (bf16, top-k up to 16; fp8 needs
        less)."""
        return _ll.size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    @staticmethod
    def get_dispatch_config(num_ranks):
        """DeepEP's recommended config (only num_sms has a meaning here, none on ubep)."""
        return Config(Buffer.num_sms, 24 if num_ranks == 2 else 6, 256, 6, 128)

    @staticmethod
    def get_combine_config(num_ranks):
        return Config(Buffer.num_sms, {2: 10, 4: 9}.get(num_ranks, 4), 256, 6, 128)

    def get_comm_stream(self):
        raise NotImplementedError("ubep.deep_ep: get_comm_stream (no CUDA streams: calls run on "
                                  "ubep's worker threads and finish before returning)")

    def get_local_buffer_tensor(self, dtype, size=None, offset=0, use_rdma_buffer=False):
        raise NotImplementedError(
            "ubep.deep_ep: get_local_buffer_tensor (ubep's windows are laid out per shape, not "
            "one raw buffer; use get_next_low_latency_combine_buffer for zero-copy combine)")

    # --- normal mode ---------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        """(num_tokens_per_rank int32, None, num_tokens_per_expert int32, is_token_in_rank bool,
        event)."""
        return _normal.get_dispatch_layout(topk_idx, num_experts, self.group_size) + \
            (EventOverlap(),)

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment=1, num_worst_tokens=0, config=None,
                 previous_event=None, async_finish=False, allocate_on_comm_stream=False):
        """DeepEP's normal dispatch: (recv_x or (codes, scales), recv_topk_idx int64,
        recv_topk_weights, num_recv_tokens_per_expert_list, handle, event); a cached dispatch
        (handle=) returns (recv_x, None, None, None, None, event)."""
        self._live("dispatch")
        return _normal.dispatch(self, x, handle, num_tokens_per_rank, is_token_in_rank,
                                num_tokens_per_expert, topk_idx, topk_weights, expert_alignment,
                                num_worst_tokens)

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                async_finish=False, allocate_on_comm_stream=False):
        """DeepEP's normal combine: (combined_x, combined_topk_weights or None, event)."""
        self._live("combine")
        return _normal.combine(self, x, handle, topk_weights, bias)

    def internode_dispatch(self, *args, **kwargs):
        raise NotImplementedError(
            "ubep.deep_ep: internode_dispatch (DeepEP's RDMA+NVLink path; ubep's dispatch "
            "serves every group and returns the intranode handle)")

    def internode_combine(self, *args, **kwargs):
        raise NotImplementedError(
            "ubep.deep_ep: internode_combine (DeepEP's RDMA+NVLink path; use combine)")

    # --- low-latency mode ----------------------------------------------------------------
    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        """Nothing to clean: ubep's messages carry epoch tags, so stale data is never read as
        new (DeepEP zeroes its flags here; the effect is the same)."""
        self._live("clean_low_latency_buffer")

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None,
                             dispatch_wait_recv_cost_stats=None, use_fp8=True, round_scale=False,
                             use_ue8m0=False, async_finish=False, return_recv_hook=False):
        """(recv_x or (codes, scales), recv_count int32, handle, event, hook)."""
        if not use_ue8m0 and dispatch_wait_recv_cost_stats is None:
            # A shape seen before (its checks passed then): _ll's cached path, here rather than
            # behind two more calls (the per-call Python work is this layer's cost). First the
            # shape of the last such call, checked by the native call itself (None: another
            # shape), then any registered one by its key.
            fp8 = bool(use_fp8)
            pow2 = fp8 and bool(round_scale)
            stats, hook = cumulative_local_expert_recv_stats, bool(return_recv_hook)
            f = self._ll_hot
            if f is not None and num_max_dispatch_tokens_per_rank == f.max_tokens and \
                    num_experts == f.num_experts and fp8 is f.fp8 and pow2 is f.pow2:
                got = _ll.fast_dispatch(f, x, topk_idx, stats, hook)
                if got is not None:
                    return got
            if self._ll_fast:
                try:
                    f = self._ll_fast.get(_ll.fast_key(num_max_dispatch_tokens_per_rank,
                                                       num_experts, x, topk_idx, fp8, pow2))
                except (AttributeError, TypeError):
                    f = None
                if f is not None:
                    got = _ll.fast_dispatch(f, x, topk_idx, stats, hook)
                    if got is not None:
                        self._ll_hot = f
                        return got
        self._live("low_latency_dispatch")
        return _ll.dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                            cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats,
                            use_fp8, round_scale, use_ue8m0, return_recv_hook)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False,
                            zero_copy=False, async_finish=False, return_recv_hook=False,
                            out=None, combine_wait_recv_cost_stats=None):
        """(combined_x, event, hook): combined_x[t] = sum over selected k of
        topk_weights[t, k] * x[expert, slot]; a new tensor, or ``out``."""
        f = handle.__dict__.get("_fast") if isinstance(handle, _ll.LowLatencyHandle) else None
        if f is not None and not use_logfmt and combine_wait_recv_cost_stats is None:
            d = handle._dispatch
            # The first combine of the window's last dispatch (of a shape _ll cached: one host,
            # a cpu window), with the dispatch's topk_idx: what _ll.combine does for it, in one
            # native call (here rather than behind two more calls). After destroy() no window
            # has a last dispatch: _ll.combine says the Buffer was destroyed.
            if not d.combined and topk_idx is d.topk_idx and f.window.last is d:
                d.combined = True
                split = return_recv_hook and f.native.algorithm == "ubep"
                src = None if zero_copy else x
                if out is None:  # DeepEP returns a new tensor: made by the native call
                    out = f.native.combine_new(src, d.id, topk_weights, split)
                else:
                    f.native.combine_into(src, d.id, topk_weights, out, split)
                if not return_recv_hook:
                    return out, _new_event(), None
                return out, _new_event(), _ll.combine_hook(f.native, x, out) if split \
                    else _ll._no_hook
        self._live("low_latency_combine")
        return _ll.combine(self, x, topk_idx, topk_weights, handle, use_logfmt, zero_copy,
                           return_recv_hook, out, combine_wait_recv_cost_stats)

    def get_next_low_latency_combine_buffer(self, handle):
        """Where experts may write their outputs for a zero_copy combine, shaped like recv_x."""
        self._live("get_next_low_latency_combine_buffer")
        return _ll.combine_buffer(self, handle)

    # --- the mask API (elastic EP, docs/ELASTIC.md) --------------------------------------
    def _check_rank(self, what, rank):
        if not 0 <= int(rank) < self.group_size:
            raise _ubep.InvalidArgument(
                f"{what}: rank {rank} out of range [0, {self.group_size})")

    def _masked_now(self):
        """The masked ranks: those the windows agreed at their last dispatch (union over the
        windows), and those masked here that no dispatch has agreed yet (DeepEP's mask buffer
        shows a rank at once). A rank masked here that the windows agreed and later dropped
        came back (its rejoin): it is forgotten, so windows made later do not mask it."""
        agreed = {r for w in self._windows.values() for r in w.native.masked_ranks()}
        self._seen |= self._masked & agreed
        self._masked -= self._seen - agreed  # agreed once, unmasked since: rejoined
        self._seen &= self._masked
        return agreed | self._masked

    def rejoin(self):
        """ubep-only: this rank, masked while alive (or a replacement process), comes back on
        every window of this Buffer (``ubep.Buffer.rejoin``): its next dispatch on each agrees
        with every live peer, which unmask it from then on."""
        self._live("rejoin")
        for w in self._windows.values():
            w.native.rejoin()

    def low_latency_update_mask_buffer(self, rank_to_mask, mask=False):
        """mask=True: ``rank_to_mask`` is masked on every window of this Buffer and on those
        made later (``ubep.Buffer.mask``; call it on every surviving rank, as DeepEP).
        mask=False: a rank that is not masked: nothing to do; a masked one comes back only by
        its own ``rejoin()`` (ubep-only, on every window), so NotImplementedError."""
        self._live("low_latency_update_mask_buffer")
        self._check_rank("low_latency_update_mask_buffer", rank_to_mask)
        r = int(rank_to_mask)
        if mask:
            for w in self._windows.values():
                w.native.mask(r)  # this rank itself: InvalidArgument from ubep, naming it
            if not self._windows and r == self.rank:
                raise _ubep.InvalidArgument(
                    f"low_latency_update_mask_buffer: rank {r} cannot mask itself")
            self._masked.add(r)
            return
        if r in self._masked_now():
            raise NotImplementedError(
                f"ubep.deep_ep: low_latency_update_mask_buffer(rank_to_mask={r}, mask=False): "
                f"ubep unmasks a rank when that rank calls Buffer.rejoin() (ubep-only), agreed at "
                f"the next dispatch; not from here")

    def low_latency_query_mask_buffer(self, mask_status):
        """Fills ``mask_status`` (int32 [num_ranks]) with 1 for masked ranks, 0 for the others:
        the mask the windows agreed at their last dispatch (before any window, the ranks
        masked here)."""
        self._live("low_latency_query_mask_buffer")
        if tuple(mask_status.shape) != (self.group_size,):
            raise _ubep.InvalidArgument(
                f"low_latency_query_mask_buffer: mask_status must have shape "
                f"[{self.group_size}], got {list(mask_status.shape)}")
        status = torch.zeros(self.group_size, dtype=mask_status.dtype)
        for r in self._masked_now():
            status[r] = 1
        mask_status.copy_(status)

    def low_latency_clean_mask_buffer(self):
        """DeepEP resets the mask; in ubep a rank that was masked comes back by its own rejoin,
        so with any rank masked this is NotImplementedError naming rejoin; else nothing to do."""
        self._live("low_latency_clean_mask_buffer")
        masked = sorted(self._masked_now())
        if masked:
            raise NotImplementedError(
                f"ubep.deep_ep: low_latency_clean_mask_buffer with ranks {masked} masked: ubep "
                f"unmasks a rank when that rank calls Buffer.rejoin() (ubep-only), agreed at the "
                f"next dispatch")


# ubep-only: DeepEP's layout without a Buffer (topk_idx torch or NumPy, any number of ranks).
get_dispatch_layout = _normal.get_dispatch_layout

__all__ = ["Buffer", "Config", "EventOverlap", "get_dispatch_layout", "topk_idx_t"]
