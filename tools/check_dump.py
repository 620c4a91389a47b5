#!/usr/bin/env python3
"""Checks a `ubep-bench --dump DIR` independently of the library, with NumPy.

Recomputes, from every rank's inputs, what each rank must have received (rows, sources, expert
ids, weights, counts) and what combine must return with the bench's identity expert, and compares
bit for bit. Usage: check_dump.py DIR   (exit status 0 = everything matches)
"""
import json
import sys

import numpy as np


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    bits = f.astype(np.float32).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    quiet = ((bits >> 16) | 0x40) & 0xFFFF
    return np.where(nan, quiet, rounded).astype(np.uint16)


def main(d):
    meta = json.load(open(f"{d}/meta.json"))
    R, E, K, H = meta["ranks"], meta["experts"], meta["topk"], meta["hidden"]
    El, bf16, layout = E // R, meta["dtype"] == "bf16", meta["layout"]
    load = lambda r, n: np.load(f"{d}/rank{r}_{n}.npy")
    x = [load(r, "x") for r in range(R)]
    idx = [load(r, "topk_idx") for r in range(R)]
    w = [load(r, "topk_weights") for r in range(R)]
    as_f32 = (lambda a: bf16_to_f32(a)) if bf16 else (lambda a: a.astype(np.float32))
    errors = 0

    def check(cond, what):
        nonlocal errors
        if not cond:
            errors += 1
            print("MISMATCH:", what)

    per_source = meta.get("placement") == "per-source"
    for me in range(R):
        recv_x, recv_src, count = load(me, "recv_x"), load(me, "recv_src"), load(me, "recv_count")
        if layout == "throughput":
            rows = [(s, t) for s in range(R) for t in range(len(x[s]))
                    if any(e >= 0 and e // El == me for e in idx[s][t])]
            check(len(recv_x) == len(rows), f"rank {me}: {len(recv_x)} rows, expected {len(rows)}")
            rti, rtw = load(me, "recv_topk_idx"), load(me, "recv_topk_weights")
            for i, (s, t) in enumerate(rows[:len(recv_x)]):
                check(tuple(recv_src[i]) == (s, t), f"rank {me} row {i}: source {tuple(recv_src[i])} != {(s, t)}")
                check(np.array_equal(recv_x[i], x[s][t]), f"rank {me} row {i}: data differs")
                mine = [(e % El if e >= 0 and e // El == me else -1) for e in idx[s][t]]
                check(list(rti[i]) == mine, f"rank {me} row {i}: expert ids {list(rti[i])} != {mine}")
                ww = [w[s][t][j] if mine[j] >= 0 else 0.0 for j in range(K)]
                check(np.array_equal(rtw[i], np.array(ww, np.float32)), f"rank {me} row {i}: weights differ")
            per_expert = [sum(1 for s, t in rows for e in idx[s][t] if e >= 0 and e // El == me and e % El == le)
                          for le in range(El)]
        else:
            per_expert = []
            for le in range(El):
                rows = [(s, t) for s in range(R) for t in range(len(x[s])) if me * El + le in list(idx[s][t])]
                per_expert.append(len(rows))
                # Compact: rows packed from slot 0; per-source: source s from slot s * rows_per_source.
                seen = [0] * R
                for i, (s, t) in enumerate(rows):
                    p = s * meta["rows_per_source"] + seen[s] if per_source else i
                    seen[s] += 1
                    check(tuple(recv_src[le][p]) == (s, t), f"rank {me} expert {le} slot {p}: source differs")
                    check(np.array_equal(recv_x[le][p], x[s][t]), f"rank {me} expert {le} slot {p}: data differs")
        check(list(count) == per_expert, f"rank {me}: recv_count {list(count)} != {per_expert}")

        # Combine with the identity expert: throughput sums the token once per destination rank,
        # in ascending rank; latency sums w[t,k] * x[t] over selected k, in ascending k; fp32,
        # one rounding at the end.
        y = load(me, "y")
        for t in range(len(x[me])):
            v = as_f32(x[me][t])
            acc = np.zeros(H, np.float32)
            if layout == "throughput":
                for r in range(R):
                    if any(e >= 0 and e // El == r for e in idx[me][t]):
                        acc = (acc + v).astype(np.float32)
            else:
                for j in range(K):
                    if idx[me][t][j] >= 0:
                        acc = (acc + (np.float32(w[me][t][j]) * v).astype(np.float32)).astype(np.float32)
            want = f32_to_bf16(acc) if bf16 else acc
            check(np.array_equal(y[t], want), f"rank {me} token {t}: combine output differs")
    print(f"{d}: {R} ranks, {layout} layout: " + ("all outputs match" if errors == 0 else f"{errors} mismatches"))
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
