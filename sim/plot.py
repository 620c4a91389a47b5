#!/usr/bin/env python3
"""Turn ubep-sim JSON results into PNG plots.

usage: python3 sim/plot.py docs/sim   # reads latency.json, sync.json, sched.json, tpot.json,
                                      # predict.json there and writes *.png beside them
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(d, name):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def save(fig, d, name):
    fig.tight_layout()
    fig.savefig(os.path.join(d, name), dpi=110)
    plt.close(fig)
    print("wrote", os.path.join(d, name))


def latency(d):
    j = load(d, "latency.json")
    if not j:
        return
    ranks = sorted({r["ranks"] for r in j["rows"]})
    fig, axes = plt.subplots(1, len(ranks), figsize=(4.2 * len(ranks), 3.6), sharey=False)
    axes = axes if len(ranks) > 1 else [axes]
    for ax, R in zip(axes, ranks):
        rows = [r for r in j["rows"] if r["ranks"] == R]
        b = [r["batch"] for r in rows]
        ax.plot(b, [r["bsp_us"] for r in rows], "o-", label="BSP")
        ax.plot(b, [r["ubep_us"] for r in rows], "s-", label="UBEP")
        ax.set_xscale("log", base=2)
        ax.set_title(f"EP{R} dispatch ({j['preset']})")
        ax.set_xlabel("tokens per rank")
        ax.set_ylabel("latency (us)")
        ax.legend()
    save(fig, d, "latency.png")


def sync(d):
    j = load(d, "sync.json")
    if not j:
        return
    rows = j["rows"]
    b = [r["batch"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for key, label in (("stop_and_wait_us", "stop-and-wait"), ("fused_us", "token-flag fusion"),
                       ("sentinel_us", "sentinel polling")):
        ax.plot(b, [r[key] for r in rows], "o-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per rank")
    ax.set_ylabel("dispatch latency (us)")
    ax.set_title(f"sync ablation, EP{rows[0]['ranks']} ({j['preset']})")
    ax.legend()
    save(fig, d, "sync.png")


def sched(d):
    j = load(d, "sched.json")
    if not j:
        return
    rows = j["rows"]
    names = [r["policy"] for r in rows]
    x = range(len(rows))
    w = 0.2
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.bar([i - 1.5 * w for i in x], [r["paper_us"] for r in rows], w, label="paper (slowest worker)")
    ax.bar([i - 0.5 * w for i in x], [r["planned_slowest_us"] for r in rows], w, label="scheduler model")
    ax.bar([i + 0.5 * w for i in x], [r["sim_slowest_sender_us"] for r in rows], w, label="sim: slowest sender")
    ax.bar([i + 1.5 * w for i in x], [r["dispatch_us"] for r in rows], w, label="sim: dispatch")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names)
    ax.set_ylabel("us")
    ax.set_title(f"scheduling ablation, {j['ranks']} ranks, {j['hot']} hot experts")
    ax.legend(fontsize=7)
    save(fig, d, "sched.png")


def tpot(d):
    j = load(d, "tpot.json")
    if not j:
        return
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for a in j["algos"]:
        v = sorted(a["tpot_ms"])
        ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=f"{a['algo']} (P99 {a['p99_ms']:.2f} ms)")
    ax.set_xlabel("TPOT (ms)")
    ax.set_ylabel("CDF over steps")
    ax.set_title(f"decode TPOT, EP{j['ranks']}, batch {j['batch']}, {j['steps']} steps")
    ax.legend()
    save(fig, d, "tpot.png")


def predict(d):
    j = load(d, "predict.json")
    if not j:
        return
    rows = [r for r in j["rows"] if "measured_us" in r]
    if not rows:
        return
    labels = [f"{r['workload']}\n{r['algo']} {r['op'][:4]}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.bar([i - 0.2 for i in x], [r["predicted_us"] for r in rows], 0.4, label="predicted (local preset)")
    ax.bar([i + 0.2 for i in x], [r["measured_us"] for r in rows], 0.4, label="measured (ubep-bench median)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("us")
    ax.legend()
    save(fig, d, "predict.png")


if __name__ == "__main__":
    d = sys.argv[1] if len(sys.argv) > 1 else "docs/sim"
    for f in (latency, sync, sched, tpot, predict):
        f(d)
