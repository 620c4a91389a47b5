#!/usr/bin/python3
"""docs/BENCHMARKS.md from one run of scripts/bench_report.sh: every number below is read from
that run's ubep-bench JSON (or is its verbatim table); nothing is typed in by hand.

usage: report.py DIR   (DIR holds runs.tsv, machine.txt and <name>.json / <name>.txt)
Writes DIR/sweep.png (matplotlib) and prints the markdown to stdout.
"""
import json
import os
import sys


def load(d, name):
    p = os.path.join(d, name + ".json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def med(run, impl, op, sync=None, dtype=None):
    """Median µs of (impl, op) in a run (of one sync mode / dtype when given), or None."""
    if not run:
        return None
    for r in run["results"]:
        if (r["impl"] == impl and r["op"] == op and (sync is None or r.get("sync") == sync)
                and (dtype is None or r.get("dtype") == dtype)):
            return r["median_us"]
    return None


def row(run, impl, op, dtype=None):
    for r in run["results"] if run else []:
        if r["impl"] == impl and r["op"] == op and (dtype is None or r.get("dtype") == dtype):
            return r
    return None


def total(run, impl, sync=None):
    d, c = med(run, impl, "dispatch", sync), med(run, impl, "combine", sync)
    return None if d is None or c is None else d + c


def base_impl(run):
    return "mpi" if med(run, "mpi", "dispatch") is not None else "a2a"


def verdict(ok):
    return "met" if ok else "**not met**"


def targets(d):
    dec, pre, tiny = load(d, "decode"), load(d, "prefill"), load(d, "tiny")
    sd, tcp = load(d, "sync_decode"), load(d, "tcp2x2")
    out = ["| target | measured | |", "|---|---|---|"]

    def bound_target(name, run):
        u, b = total(run, "ubep"), total(run, "bound")
        if u is None or b is None:
            out.append(f"| {name}, 2 procs: ubep dispatch+combine <= 1.2x bound | not run | |")
            return
        kd = row(run, "bound", "dispatch").get("kernel")
        kc = row(run, "bound", "combine").get("kernel")
        out.append(f"| {name}, 2 procs: ubep dispatch+combine <= 1.2x bound | {u / b:.2f}x "
                   f"({u:.0f} vs {b:.0f} µs; bound kernels: dispatch {kd}, combine {kc}) "
                   f"| {verdict(u / b <= 1.2)} |")

    bound_target("decode", dec)
    bound_target("prefill", pre)
    u, f = total(tiny, "ubep"), med(tiny, "floor", "roundtrip")
    bd, bc = med(tiny, "bound", "dispatch"), med(tiny, "bound", "combine")
    if None not in (u, f, bd, bc):
        fc = bd + bc + 2 * f
        out.append(f"| tiny, 2 procs: ubep dispatch+combine <= 3x (floor + copy) | {u / fc:.2f}x "
                   f"({u:.1f} µs vs 2 round trips {2 * f:.2f} + bound {bd + bc:.1f} µs) "
                   f"| {verdict(u / fc <= 3)} |")
    fp8 = load(d, "fp8_decode")
    ub, uf = med(fp8, "ubep", "dispatch", dtype="bf16"), med(fp8, "ubep", "dispatch", dtype="fp8")
    bb, bf = med(fp8, "bound", "dispatch", dtype="bf16"), med(fp8, "bound", "dispatch", dtype="fp8")
    if None in (ub, uf, bb, bf):
        out.append("| fp8 decode dispatch <= 0.6x bf16 dispatch | not run | |")
    else:
        uc = med(fp8, "ubep", "dispatch", dtype="fp8-cast")
        cast = f"; casting bf16 on send {uc / ub:.2f}x" if uc is not None else ""
        out.append(f"| fp8 decode dispatch <= 0.6x bf16 dispatch | {uf / ub:.2f}x ({uf:.0f} vs "
                   f"{ub:.0f} µs; the bound itself moves {bf / bb:.2f}x as the bytes drop to "
                   f"{row(fp8, 'bound', 'dispatch', 'fp8')['bytes_per_rank'] / row(fp8, 'bound', 'dispatch', 'bf16')['bytes_per_rank']:.2f}x"
                   f"{cast}) | {verdict(uf / ub <= 0.6)} |")
    for name, where in [("straggler_threads4", "4 thread ranks"), ("straggler_procs4", "4 procs")]:
        run = load(d, name)
        if not run:
            continue

        def late(impl, op, us):
            return next((r["median_us"] for r in run["results"] if r["impl"] == impl
                         and r["op"] == op and r.get("late_us") == us), None)
        p0, p2 = late("ubep-per-source", "dispatch_send", 0), late("ubep-per-source", "dispatch_send", 2000)
        if None not in (p0, p2):
            grow = "; ".join(f"{i} {late(i, 'dispatch_send', 0):.0f} -> {late(i, 'dispatch_send', 2000):.0f}"
                             for i in ("ubep-compact", "bsp")
                             if None not in (late(i, "dispatch_send", 0), late(i, "dispatch_send", 2000)))
            out.append(f"| rank 0 late by 2000 µs, {where}: per-source dispatch_send <= 2x its "
                       f"no-delay median | {p2 / p0:.2f}x ({p0:.0f} -> {p2:.0f} µs; {grow} µs) "
                       f"| {verdict(p2 / p0 <= 2)} |")
    pc, pp = load(d, "placement_compact"), load(d, "placement_per_source")
    c, q = total(pc, "ubep"), total(pp, "ubep")
    if None not in (c, q):
        out.append(f"| no delay, decode, 4 thread ranks: per-source dispatch+combine no slower "
                   f"than compact (within noise) | {q / c:.2f}x ({q:.0f} vs {c:.0f} µs, one run "
                   f"each) | see runs |")
    # A bound that an implementation beats is not a bound: check every run that has one.
    beaten = []
    for name in ["decode", "prefill", "tiny", "sync_decode", "sync_tiny", "threads2",
                 "workers1", "threads8", "fp8_decode"] + [f"sweep_{t}" for t in sweep_tokens()]:
        run = load(d, name)
        for r in run["results"] if run else []:
            if r["impl"] not in ("bound", "bound_packed", "floor", "barrier") \
                    and 0 < r.get("x_bound", 1) < 1:
                beaten.append(f"{name}: {r['impl']} {r['op']} {r['x_bound']:.2f}x")
    out.append("| no implementation beats the bound (every run above) | "
               + ("none below 1.00x" if not beaten else "; ".join(beaten))
               + f" | {verdict(not beaten)} |")
    b = base_impl(dec)
    tb, tp, tu = total(dec, b), total(dec, "bsp"), total(dec, "ubep")
    if None not in (tb, tp, tu):
        out.append(f"| decode, 2 procs: bsp <= 0.8x mpi | {tp / tb:.2f}x ({tp:.0f} vs {tb:.0f} µs) "
                   f"| {verdict(tp / tb <= 0.8)} |")
        out.append(f"| decode, 2 procs: ubep <= 0.5x mpi | {tu / tb:.2f}x ({tu:.0f} µs) "
                   f"| {verdict(tu / tb <= 0.5)} |")
        out.append(f"| decode, 2 procs: ubep <= 0.75x bsp | {tu / tp:.2f}x | {verdict(tu / tp <= 0.75)} |")
    tb, tu = total(tiny, base_impl(tiny)), total(tiny, "ubep")
    if None not in (tb, tu):
        out.append(f"| tiny, 2 procs: ubep <= 0.25x mpi (older target; the floor target above "
                   f"replaces it) | {tu / tb:.2f}x ({tu:.1f} vs {tb:.1f} µs) | {verdict(tu / tb <= 0.25)} |")
    tb, tu = total(tcp, "mpi"), total(tcp, "ubep")
    if None not in (tb, tu):
        out.append(f"| 2 hosts x 2 ranks over TCP: ubep faster than mpi | {tu / tb:.2f}x "
                   f"({tu / 1e3:.1f} vs {tb / 1e3:.1f} ms) | {verdict(tu < tb)} |")
        r = row(tcp, "ubep", "dispatch")
        if r and "network_rows" in r:
            ok = abs(r["network_rows"] - r["expected_network_rows"]) < 0.5
            out.append(f"| 2x2: network rows = deduplicated volume | {r['network_rows']:.0f} = "
                       f"{r['expected_network_rows']:.0f} token rows per rank per call | {verdict(ok)} |")
    f, s = total(sd, "ubep", "fused"), total(sd, "ubep", "stop-and-wait")
    if None not in (f, s):
        out.append(f"| sync ablation, decode: fused vs stop-and-wait (paper -31% to -57%) | "
                   f"{(f / s - 1) * 100:+.0f}% ({f:.0f} vs {s:.0f} µs) | CPU: see PERFORMANCE.md |")
    return "\n".join(out)


def attribution(d):
    """Where ubep's lead over bsp comes from, in the decode and prefill runs."""
    out = ["| run | dispatch bsp / ubep µs | combine bsp / ubep µs | share of ubep's lead from "
           "combine | flag barrier µs (x5 per dispatch+combine) | 5 barriers / bsp total | "
           "bsp count exchange, set-flag & verify µs |", "|---|---|---|---|---|---|---|"]
    for name in ["decode", "prefill", "tiny", "threads2", "threads8"]:
        run = load(d, name)
        bd, ud = med(run, "bsp", "dispatch"), med(run, "ubep", "dispatch")
        bc, uc = med(run, "bsp", "combine"), med(run, "ubep", "combine")
        if None in (bd, ud, bc, uc):
            continue
        lead = (bd + bc) - (ud + uc)
        share = f"{(bc - uc) / lead * 100:.0f}%" if lead > 0 else "no lead"
        fb = med(run, "barrier", "flag")
        bar = f"{fb:.2f} ({5 * fb:.1f})" if fb is not None else "-"
        frac = f"{5 * fb / (bd + bc) * 100:.2f}%" if fb is not None else "-"
        st = dict(row(run, "bsp", "dispatch").get("stages_us", {}))
        stages = f"{st.get('count exchange', 0):.1f}, {st.get('set-flag & verify', 0):.1f}"
        out.append(f"| {name} | {bd:.1f} / {ud:.1f} ({bd / ud:.2f}x) | {bc:.1f} / {uc:.1f} "
                   f"({bc / uc:.2f}x) | {share} | {bar} | {frac} | {stages} |")
    return "\n".join(out)


def sweep_tokens():
    return [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def sweep(d):
    """The sweep's table, and its picture in DIR/sweep.png."""
    pts = [(t, load(d, f"sweep_{t}")) for t in sweep_tokens()]
    pts = [(t, r) for t, r in pts if r]
    if not pts:
        return "(no sweep in this run)", None
    impls = [("mpi", "MPI baseline (pack, MPI_Alltoallv, unpack)"), ("bsp", "ubep bsp"),
             ("ubep", "ubep ubep"), ("bound", "bound (all ranks copying at once)")]
    lines = ["| tokens/rank | " + " | ".join(f"{i} d+c µs" for i, _ in impls)
             + " | floor µs | ubep x bound |", "|---" * (len(impls) + 3) + "|"]
    for t, r in pts:
        cells = [f"{total(r, i):.1f}" if total(r, i) is not None else "-" for i, _ in impls]
        u, b, f = total(r, "ubep"), total(r, "bound"), med(r, "floor", "roundtrip")
        lines.append(f"| {t} | " + " | ".join(cells) + f" | {f:.2f} | {u / b:.2f}x |")
    png = None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
        for ax, (op, title) in zip(axes, [("dispatch", "dispatch"), ("combine", "combine"),
                                          (None, "dispatch + combine")]):
            for impl, label in impls:
                xs, ys = [], []
                for t, r in pts:
                    v = total(r, impl) if op is None else med(r, impl, op)
                    if v is not None:
                        xs.append(t)
                        ys.append(v)
                style = "k--" if impl == "bound" else "o-"
                ax.plot(xs, ys, style, label=label, markersize=4)
            fl = [(t, med(r, "floor", "roundtrip") * (2 if op is None else 1)) for t, r in pts]
            ax.plot([t for t, _ in fl], [v for _, v in fl], ":", color="gray",
                    label="latency floor (flag round trip%s)" % (" x2" if op is None else ""))
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_yscale("log")
            ax.set_xlabel("tokens per rank")
            ax.set_ylabel("µs (median, slowest rank)")
            ax.set_title(title)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=8)
        c = pts[0][1]["config"]
        fig.suptitle(f"ubep-bench, 2 process ranks, hidden {c['hidden']}, top-{c['topk']} of "
                     f"{c['experts']} experts, {c['dtype']}, {c['layout']} layout")
        fig.tight_layout()
        png = os.path.join(d, "sweep.png")
        fig.savefig(png, dpi=110)
    except ImportError as e:  # the table still stands without the picture
        sys.stderr.write(f"report.py: no plot ({e}); install python3-matplotlib\n")
    return "\n".join(lines), png


def main():
    d = sys.argv[1]
    machine = dict(l.rstrip("\n").split(": ", 1) for l in open(os.path.join(d, "machine.txt")))
    runs = [l.rstrip("\n").split("\t") for l in open(os.path.join(d, "runs.tsv"))]
    rel = os.path.relpath(d, "docs")
    sweep_md, png = sweep(d)
    p = print
    p("# ubep benchmarks\n")
    p(f"Generated by `scripts/bench_report.sh` on {machine['date']} (commit {machine['commit']}); "
      "every number on this page comes from that one run (the targets, attribution and sweep "
      "tables are computed from the runs' JSON in "
      f"[{rel}/]({rel}/) by `tools/bench/report.py`). The analysis is in "
      "[PERFORMANCE.md](PERFORMANCE.md).\n")
    p(f"Machine: {machine['cpu']}, {machine['os']}. Load average at start: "
      f"{machine['load_start']}, at end: {machine.get('load_end', '?')}.\n")
    p(f"CPU pressure (`/proc/pressure/cpu`, some avg10) at start: "
      f"{machine.get('cpu_pressure_start', 'not recorded')}.\n")
    p("""Each table is one run of `ubep-bench`: the MPI baseline (pack -> MPI_Alltoall ->
MPI_Alltoallv -> unpack; "a2a" on thread ranks: the same bulk exchange through memory), ubep's
`bsp` and `ubep` algorithms -- every timed op of every implementation starting on all ranks at
once (a start barrier outside the timing whose waiters never sleep or yield their core, so no
op's time includes a peer that is still in its untimed expert step or waking up; each op's
per-rank breakdown -- own work, wait on a peer, start skew -- follows its table) -- and,
measured in the same run on the same ranks:
* **bound**: every rank at once (the same start barrier before each op) copies the rows it sends from its
  tokens into their places in the destinations' shared windows, where the call's layout puts
  them (latency layout: each local expert's region, each source's part of it; dispatch;
  candidates memcpy and 16- and 64-byte non-temporal store loops, and the widest of those with
  plain stores for a small call's rows to the rank itself, as the library stores them); then, after a fresh untimed
  dispatch and an untimed expert copy of the received rows into the combine input as the
  bench's expert does (so each candidate finds the rows where and as warm as a call does, and
  never in cache from the previous candidate), reads its tokens' rows back from there (combine;
  candidates memcpy or non-temporal copies into the token's output row, and "or-reduce": all
  of a token's rows read at once and OR-ed into one output row, the traffic of a reduction with
  the cheapest operation, also with the library's software prefetch into L2
  ("or-reduce-prefetch", "or-reduce-128B-prefetch") and with non-temporal output stores as
  the library uses from 4 MiB of output ("-stream")). Successive ops alternate window halves,
  as calls do. The fastest median wins per op and the row names it.
  **bound_packed** (latency layout only): the same with the rows packed by source in send
  order -- not a bound of the call, which cannot choose where its rows go, but what the latency
  layout's addresses cost.
  `x_bound` = median / the bound of the same op.
* **latency floor**: a one-cache-line flag round trip between ranks 0 and 1 through shared
  memory, and one all-to-all flag barrier (the kind bsp makes after each stage).

µs are medians and p99 over iterations of the slowest rank; GB/s = bytes received per rank /
median time. The machine is shared with other people's builds: before each run the script waits
(up to UBEP_REPORT_WAIT seconds; this run: {wait}) until no other task is runnable, and prints
how many were, on average, just before the run (the sampling itself shows as about one). The bench's expert is the identity; with `ubep::Buffer` it writes its output into
the zero-copy combine buffer, outside the timed region.
""".replace("{wait}", machine.get("wait_s", "not recorded") + " s"))
    p("## Targets, as measured in the runs below\n")
    p(targets(d) + "\n")
    p("## Where ubep's lead over bsp comes from\n")
    p("bsp and ubep dispatch and combine medians from the runs below; the flag barrier is the "
      "bench's measured all-to-all flag barrier (bsp makes 3 per dispatch and 2 per combine).\n")
    p(attribution(d) + "\n")
    p("## Time against tokens per rank\n")
    if png:
        p(f"![µs against tokens per rank]({os.path.relpath(png, 'docs')})\n")
    sw = [r for r in runs if r[0].startswith("sweep_")]
    if sw:
        qs = [open(os.path.join(d, r[0] + ".quiet")).read().strip() for r in sw
              if os.path.exists(os.path.join(d, r[0] + ".quiet"))]
        p(f"`{sw[0][2]}`, for tokens 1 .. 4096 (iterations scaled down with size). Other runnable "
          f"tasks just before each point: {', '.join(qs) if qs else 'not recorded'}.\n")
    p(sweep_md + "\n")
    p("## Runs\n")
    for name, title, cmd in runs:
        if name.startswith("sweep_"):
            continue
        q = os.path.join(d, name + ".quiet")
        note = ""
        if os.path.exists(q):
            note = (f"Other runnable tasks on the machine just before this run (mean of 10 samples): "
                    f"{open(q).read().strip()}.\n\n")
        p(f"### {title}\n\n{note}```\n$ {cmd}")
        p(open(os.path.join(d, name + ".txt")).read().rstrip("\n"))
        p("```\n")


if __name__ == "__main__":
    main()
