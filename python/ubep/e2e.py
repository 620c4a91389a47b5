"""End to end: transformers MoE models decoding expert-parallel over ubep, with TPOT.

    python -m ubep.e2e --ranks 2                        # launches torchrun itself
    python -m ubep.e2e --ranks 4 --arch qwen3_moe,mixtral --impl ubep,bsp,torch --json out.json

Needs torch 2.x and transformers 5 (the project's venv: scripts/venv.sh). Every rank builds the
same small random-weight model (``_e2e_models.build_model``, no hub), greedily decodes its own
prompts with the unmodified model (the reference: what one process computes), then for each
implementation swaps every MoE layer's experts for this rank's share (``shard_experts``) and
decodes the same prompts again, timing each decode step:

* ``ubep`` / ``bsp``: ubep.Buffer dispatch -> local experts -> combine (the two algorithms);
* ``torch``: torch.distributed ``all_to_all_single`` over gloo;
* ``hf``: transformers' own expert parallelism (``DistributedConfig(tp_size=R, ep_size=R)``:
  transformers 5.19 refuses ``ep_size != tp_size``, so attention is tensor-parallel and every
  rank feeds all ranks' prompts, keeping its own rows), when it runs here; otherwise the reason
  is printed.

Prints, per architecture and implementation: whether the tokens equal the reference on every
rank (or the first decode step whose token differs), decode TPOT P50/P99 (a step's time is its slowest rank's), prefill time, and the share of
the decode steps spent in communication calls (dispatch/combine or all_to_all_single).
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import time

IMPLS = ("ubep", "bsp", "torch", "hf")
# A deliberately wrong layer (the router's weights dropped at combine) for the tests: it shows
# that the token check can fail, i.e. that these models' tokens depend on the expert outputs.
BROKEN = "ubep-unweighted"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m ubep.e2e", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="processes to launch (torchrun)")
    p.add_argument("--arch", default="qwen3_moe,mixtral",
                   help="comma-separated: qwen3_moe, mixtral, deepseek_v3")
    p.add_argument("--impl", default=",".join(IMPLS), help="comma-separated: " + ", ".join(IMPLS))
    p.add_argument("--steps", type=int, default=32, help="decode steps per run")
    p.add_argument("--repeats", type=int, default=1, help="decode runs per implementation")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--json", default="", help="write the results here (rank 0)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.arch = [a for a in args.arch.split(",") if a]
    args.impl = [i for i in args.impl.split(",") if i]
    bad = [i for i in args.impl if i not in IMPLS + (BROKEN,)]
    if bad:
        p.error(f"unknown --impl {', '.join(bad)}; expected some of {', '.join(IMPLS)}")
    if args.ranks < 1 or args.experts % args.ranks:
        p.error(f"--experts {args.experts} must split evenly over --ranks {args.ranks}")
    return args


def prompts(rank, args, vocab):
    import torch
    gen = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(0, vocab, (args.batch, args.prompt_len), generator=gen)


def greedy(model, ids, steps, clock=None):
    """Prefill ``ids`` then ``steps`` greedy decode steps with the KV cache: (tokens [batch,
    steps], prefill seconds, per-step seconds, per-step communication seconds)."""
    import torch
    step_s, comm_s, out = [], [], []
    with torch.no_grad():
        t0 = time.perf_counter()
        res = model(ids, use_cache=True)
        prefill = time.perf_counter() - t0
        nxt = res.logits[:, -1].argmax(-1, keepdim=True)
        cache = res.past_key_values
        for _ in range(steps):
            out.append(nxt)
            if clock is not None:
                clock.reset()
            t0 = time.perf_counter()
            res = model(nxt, past_key_values=cache, use_cache=True)
            nxt = res.logits[:, -1].argmax(-1, keepdim=True)
            step_s.append(time.perf_counter() - t0)
            comm_s.append(clock.seconds if clock is not None else 0.0)
            cache = res.past_key_values
    return torch.cat(out, dim=1), prefill, step_s, comm_s


def _sharded(base, impl, args, rank, ranks, buffers):
    """(model, clock) for one implementation: a copy of ``base`` with its experts sharded."""
    from . import _e2e_models as m
    model, clock = copy.deepcopy(base), m.CommClock()
    if impl in ("ubep", "bsp", BROKEN):
        buf = buffers[0]
        buf.algorithm = "bsp" if impl == "bsp" else "ubep"
        unweighted = impl == BROKEN
        m.shard_experts(model, lambda ex, i: m.UbepExperts(ex, buf, clock, unweighted))
    else:
        m.shard_experts(model, lambda ex, i: m.TorchA2AExperts(ex, rank, ranks, clock))
    return model, clock


def _hf_model(arch, args, rank, ranks, base):
    """transformers' own expert parallelism: the same weights saved and loaded back with
    DistributedConfig(ep_size=ranks). Raises with transformers' reason where it does not run."""
    import tempfile

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig
    path = [tempfile.mkdtemp(prefix="ubep-e2e-") if rank == 0 else None]
    dist.broadcast_object_list(path, src=0)
    if rank == 0:
        base.save_pretrained(path[0])
    dist.barrier()
    cfg = DistributedConfig(tp_size=ranks, ep_size=ranks)
    return AutoModelForCausalLM.from_pretrained(path[0], distributed_config=cfg).eval()


def _stats(values):
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(round(q * (len(s) - 1))))]  # noqa: E731
    return pick(0.5), pick(0.99)


def _gather(obj):
    import torch.distributed as dist
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def run_arch(arch, args, rank, ranks, buffers):
    """One architecture: the reference, then every implementation. Rows for rank 0's table."""
    import torch

    from . import _e2e_models as m
    base = m.build_model(arch, num_experts=args.experts, top_k=args.topk,
                         layers=args.layers)
    ids = prompts(rank, args, base.config.vocab_size)
    ref, ref_prefill, ref_steps, _ = greedy(base, ids, args.steps)
    rows = [dict(arch=arch, impl="reference (1 process, all experts)", tokens_equal=None,
                 **_summary(_gather((ref_steps, [0.0] * len(ref_steps), ref_prefill))))]
    if not buffers:
        import ubep
        buffers.append(ubep.Buffer(torch.distributed.group.WORLD, hidden=base.config.hidden_size,
                                   num_experts=args.experts,
                                   max_tokens_per_rank=args.batch * args.prompt_len,
                                   max_topk=args.topk, dtype=torch.float32))
    for impl in args.impl:
        try:
            if impl == "hf":
                model, clock = _hf_model(arch, args, rank, ranks, base), None
            else:
                model, clock = _sharded(base, impl, args, rank, ranks, buffers)
        except Exception as e:  # noqa: BLE001 - reported in the table, not fatal
            reasons = _gather(f"{type(e).__name__}: {e}".splitlines()[0][:300])
            rows.append(dict(arch=arch, impl=impl, error=reasons[0]))
            continue
        run_ids, mine = ids, slice(None)
        if impl == "hf":
            # transformers' EP comes with tensor-parallel attention (tp_size = ep_size): the
            # ranks of a TP group must see one batch. So every rank feeds all ranks' prompts
            # (the same sequences in all as the other rows: R x batch) and keeps its own rows.
            run_ids = torch.cat([prompts(r, args, base.config.vocab_size)
                                 for r in range(ranks)])
            mine = slice(rank * args.batch, (rank + 1) * args.batch)
        steps, comm, prefill, first_diff = [], [], [], args.steps
        for _ in range(args.repeats):
            toks, pf, st, cs = greedy(model, run_ids, args.steps, clock)
            toks = toks[mine]
            diff = (toks != ref).any(dim=0).nonzero().flatten().tolist()
            first_diff = min([first_diff] + diff[:1])
            steps += st
            comm += cs
            prefill.append(pf)
        got = _gather((steps, comm, min(prefill), first_diff))
        first = min(g[3] for g in got)  # the first decode step whose token differs, any rank
        rows.append(dict(arch=arch, impl=impl, tokens_equal=first == args.steps,
                         first_differing_step=None if first == args.steps else first,
                         comm_measured=clock is not None, **_summary([g[:3] for g in got])))
    return rows


def _summary(per_rank):
    """TPOT of each step = its slowest rank's; communication share = comm / step seconds over
    all ranks and steps."""
    steps = [max(r[0][i] for r in per_rank) for i in range(len(per_rank[0][0]))]
    p50, p99 = _stats(steps)
    total = sum(sum(r[0]) for r in per_rank)
    comm = sum(sum(r[1]) for r in per_rank)
    return dict(tpot_p50_ms=p50 * 1e3, tpot_p99_ms=p99 * 1e3, samples=len(steps),
                prefill_ms=max(r[2] for r in per_rank) * 1e3,
                comm_share=comm / total if total else 0.0)


def print_table(rows, args, ranks):
    print(f"\nubep.e2e: {ranks} ranks, {args.batch} sequences per rank, prompt {args.prompt_len}, "
          f"{args.steps} decode steps x {args.repeats}, {args.experts} experts top-{args.topk}, "
          f"fp32; load average {os.getloadavg()[0]:.2f}")
    print(f"{'arch':<12} {'impl':<36} {'tokens':<8} {'TPOT P50 ms':>11} {'P99 ms':>8} "
          f"{'prefill ms':>10} {'comm share':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['arch']:<12} {r['impl']:<36} not run: {r['error']}")
            continue
        eq = "-" if r["tokens_equal"] is None else ("equal" if r["tokens_equal"] else
                                                    f"step {r['first_differing_step']}")
        share = f"{r['comm_share']:>9.1%}" if r.get("comm_measured", True) else "      n/a"
        print(f"{r['arch']:<12} {r['impl']:<36} {eq:<8} {r['tpot_p50_ms']:>11.2f} "
              f"{r['tpot_p99_ms']:>8.2f} {r['prefill_ms']:>10.1f} {share}")
    sys.stdout.flush()


def worker(args):
    import gc
    import weakref

    import torch
    import torch.distributed as dist

    # The default group should die at destroy_process_group: while it lives so do gloo's
    # worker threads, which drop the last collective's tensors late, and one that does so once
    # the interpreter is finalizing aborts the process ("terminate called without an active
    # exception" in a gloo thread's AsyncAllgatherWork destructor, after every token was right:
    # CI of 17a37dd; 1 of 7 local 4-rank runs). Three things kept it alive: importing
    # torch.distributed.fsdp (transformers does) once the group exists takes 10 references to it
    # that destroy_process_group does not drop (sys.getrefcount 9 -> 19), so it is imported
    # first; the models' reference cycles hold the ubep Buffers (gc.collect below); and
    # transformers' own EP (--impl hf) leaves DeviceMeshes holding it, which main() answers by
    # leaving without finalizing.
    import torch.distributed.fsdp  # noqa: F401
    import transformers  # noqa: F401
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = weakref.ref(dist.group.WORLD)
    rank, ranks = dist.get_rank(), dist.get_world_size()
    rows, buffers = [], []
    for arch in args.arch:
        rows += run_arch(arch, args, rank, ranks, buffers)
    if rank == 0:
        print_table(rows, args, ranks)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(config=vars(args), ranks=ranks, load=os.getloadavg(),
                               results=rows), f, indent=1)
    ok = all(r.get("tokens_equal") is not False for r in rows if r["impl"] != BROKEN)
    buffers.clear()
    gc.collect()
    dist.destroy_process_group()
    return ok, world() is not None


def main(argv=None):
    args = parse_args(argv)
    if args.worker or "LOCAL_RANK" in os.environ:
        ok, group_lives = worker(args)
        if group_lives:
            # Results are written and ubep's Buffers are gone; finalizing now could meet a gloo
            # thread still dropping tensors (see worker), so the process ends without it.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0 if ok else 1)
        sys.exit(0 if ok else 1)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={args.ranks}", "-m", "ubep.e2e", "--worker"]
    cmd += sys.argv[1:] if argv is None else argv
    sys.exit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
