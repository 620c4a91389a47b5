"""An independent NumPy model of dispatch and combine (docs/SEMANTICS.md), and test inputs.

Element data is kept raw: bf16 as uint16 bit patterns, fp32 as float32. Dispatch is a copy, so
rows compare bit for bit; combine accumulates in float32 from 0 in the documented order, each
product rounded before its add, and rounds to the dtype once.
"""
import numpy as np


def bf16_round(f):
    """float32 -> bf16 bits, round to nearest even (the values here are finite)."""
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def values(raw, dtype):
    return bf16_value(raw) if dtype == "bf16" else np.asarray(raw, dtype=np.float32)


def to_raw(f32, dtype):
    return bf16_round(f32) if dtype == "bf16" else np.asarray(f32, dtype=np.float32)


class Spec:
    """Shapes of one test world."""

    def __init__(self, ranks=2, tokens=6, hidden=40, experts=8, topk=3, dtype="bf16", seed=1,
                 ranks_per_host=0):
        self.R, self.T, self.H, self.E, self.K = ranks, tokens, hidden, experts, topk
        self.ranks_per_host = ranks_per_host  # > 0: hosts of that many ranks (the relay)
        self.El = experts // ranks
        self.dtype, self.seed = dtype, seed

    def num_tokens(self, rank, it):
        # Differing counts per rank and call, including a full buffer and an empty rank.
        return [self.T, self.T - 1, 0, 1, self.T // 2][(rank + 2 * it) % 5]


def make_inputs(spec, rank, it):
    """(x raw [n, H], topk_idx int64 [n, K] with -1s, topk_weights float32 [n, K])."""
    rng = np.random.default_rng(spec.seed * 1000 + rank * 10 + it)
    n = spec.num_tokens(rank, it)
    x = to_raw(rng.uniform(-2, 2, size=(n, spec.H)).astype(np.float32), spec.dtype)
    idx = np.full((n, spec.K), -1, dtype=np.int64)
    for t in range(n):
        chosen = rng.choice(spec.E, size=spec.K, replace=False)
        keep = rng.random(spec.K) < 0.8  # some -1 entries, and tokens with no expert
        if t == 0:
            keep[:] = True
        idx[t, keep] = chosen[keep]
    w = rng.uniform(0.05, 1.0, size=(n, spec.K)).astype(np.float32)
    return x, idx, w


def mask_inputs(spec, inputs, masked):
    """Every rank's (x, idx, w) as the reference must see them when the ranks in ``masked`` are
    masked (docs/ELASTIC.md): a masked rank sends nothing, and the others' topk entries naming
    its experts become -1. Returns (xs, idxs, ws)."""
    xs, idxs, ws = [], [], []
    for r, (x, idx, w) in enumerate(inputs):
        if r in masked:
            x, idx, w = x[:0], idx[:0], w[:0]
        idx = idx.copy()
        for m in masked:
            idx[(idx >= 0) & (idx // spec.El == m)] = -1
        xs.append(x)
        idxs.append(idx)
        ws.append(w)
    return xs, idxs, ws


def make_expert_output(spec, rank, it, shape):
    """What the 'experts' hand to combine: random rows (every misplaced row shows)."""
    rng = np.random.default_rng(spec.seed * 7777 + rank * 10 + it)
    return to_raw(rng.uniform(-1, 1, size=shape).astype(np.float32), spec.dtype)


def dispatch_throughput(spec, xs, idxs, ws):
    """Per destination rank: recv_x, recv_topk_idx (int32 local ids), recv_topk_weights,
    recv_src, recv_count."""
    out = []
    for d in range(spec.R):
        lo, hi = d * spec.El, (d + 1) * spec.El
        rows, src, lidx, lw = [], [], [], []
        count = np.zeros(spec.El, dtype=np.int64)
        for s in range(spec.R):
            for t in range(xs[s].shape[0]):
                here = (idxs[s][t] >= lo) & (idxs[s][t] < hi)
                if not here.any():
                    continue
                rows.append(xs[s][t])
                src.append((s, t))
                lidx.append(np.where(here, idxs[s][t] - lo, -1).astype(np.int32))
                lw.append(np.where(here, ws[s][t], np.float32(0)).astype(np.float32))
                for e in idxs[s][t][here]:
                    count[e - lo] += 1
        n = len(rows)
        out.append(dict(
            recv_x=np.array(rows).reshape(n, spec.H).astype(xs[0].dtype),
            recv_topk_idx=np.array(lidx, dtype=np.int32).reshape(n, spec.K),
            recv_topk_weights=np.array(lw, dtype=np.float32).reshape(n, spec.K),
            recv_src=np.array(src, dtype=np.int64).reshape(n, 2),
            recv_count=count))
    return out


def host_of(spec, rank):
    return rank // spec.ranks_per_host if spec.ranks_per_host else 0


def add_by_host(spec, shape, contributions):
    """contributions: (rank, float32 row) in the documented order. One host: their sum from 0
    in that order. Across hosts: each host's partial from 0 in that order, then the partials
    added in ascending host order (SEMANTICS.md, Arithmetic)."""
    hosts = sorted({host_of(spec, r) for r, _ in contributions})
    total = np.zeros(shape, dtype=np.float32)
    for h in hosts:
        part = np.zeros(shape, dtype=np.float32)
        for r, v in contributions:
            if host_of(spec, r) == h:
                part = part + v
        total = total + part
    return total


def combine_throughput(spec, disp, expert_out, num_tokens):
    """y per owner: sum over destination ranks ascending of the row sent back for the token."""
    ys = []
    for s in range(spec.R):
        contrib = [[] for _ in range(num_tokens[s])]
        for d in range(spec.R):
            vals = values(expert_out[d], spec.dtype)
            for row, (src_rank, t) in enumerate(disp[d]["recv_src"]):
                if src_rank == s:
                    contrib[t].append((d, vals[row]))
        acc = np.zeros((num_tokens[s], spec.H), dtype=np.float32)
        for t in range(num_tokens[s]):
            acc[t] = add_by_host(spec, spec.H, contrib[t])
        ys.append(to_raw(acc, spec.dtype))
    return ys


def dispatch_latency(spec, xs, idxs, placement="compact"):
    """Per destination: recv_x [El, T*R, H] (valid rows only; the rest zero), valid [El, T*R]
    (which rows are defined), recv_count, recv_src, and where each (source, token, k) landed:
    where[(s, t, k)] = (d, e, row). Compact: expert e's rows packed from 0, by source rank then
    token. Per-source: source s's rows for expert e start at row s * T."""
    RT = spec.T * spec.R
    out, where = [], {}
    for d in range(spec.R):
        recv_x = np.zeros((spec.El, RT, spec.H), dtype=xs[0].dtype)
        recv_src = np.zeros((spec.El, RT, 2), dtype=np.int64)
        valid = np.zeros((spec.El, RT), dtype=bool)
        count = np.zeros(spec.El, dtype=np.int64)
        for e in range(spec.El):
            g = d * spec.El + e
            for s in range(spec.R):
                n_s = 0  # rows from source s for expert e so far
                for t in range(xs[s].shape[0]):
                    ks = np.nonzero(idxs[s][t] == g)[0]
                    if ks.size == 0:
                        continue
                    p = count[e] if placement == "compact" else s * spec.T + n_s
                    recv_x[e, p] = xs[s][t]
                    recv_src[e, p] = (s, t)
                    valid[e, p] = True
                    where[(s, t, int(ks[0]))] = (d, e, p)
                    count[e] += 1
                    n_s += 1
        out.append(dict(recv_x=recv_x, recv_count=count, recv_src=recv_src, valid=valid))
    return out, where


def combine_latency(spec, where, expert_out, idxs, ws):
    """y[t] = sum over selected k ascending of w[t,k] * out(t,k), fp32, one rounding."""
    ys = []
    for s in range(spec.R):
        n = idxs[s].shape[0]
        acc = np.zeros((n, spec.H), dtype=np.float32)
        for t in range(n):
            contrib = []
            for k in range(spec.K):
                if idxs[s][t, k] < 0:
                    continue
                d, e, p = where[(s, t, k)]
                prod = np.float32(ws[s][t, k]) * values(expert_out[d][e, p], spec.dtype)
                contrib.append((d, prod.astype(np.float32)))
            acc[t] = add_by_host(spec, spec.H, contrib)
        ys.append(to_raw(acc, spec.dtype))
    return ys
