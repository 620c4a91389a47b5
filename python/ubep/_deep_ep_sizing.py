"""Byte budgets -> shapes for ubep.deep_ep.

DeepEP sizes its buffers in bytes (num_nvl_bytes, num_rdma_bytes); ubep sizes a window by shape
(max tokens per rank, hidden, experts, top-k). ``window_bytes`` is the size of one rank's ubep
window for a shape (the formula of ``WindowLayout`` in src/protocol/protocol.hpp, mirrored here so a
capacity can be chosen before the collective construction). The Buffer checks the real
``shared_bytes`` after construction as well, so a drift between the two is an error naming both
numbers, never a window larger than the budget (tests/test_deep_ep_api.py compares them).
"""
from . import _ubep

_LINE = 64      # kCacheLine
_TAG = 4        # sizeof(Tag)
_PAGE = 4096    # halves are page-aligned
_STAGE_SLOTS = 8
_LATENCY_RECORD = 8  # sizeof(LatencyRecord): its tag and token_k

# The top-k the low-latency size hint covers (DeepEP's hint takes no top-k; DeepEP's kernels
# support up to 9 selections for low latency).
HINT_TOPK = 16


def _up(n, a):
    return -(-n // a) * a


def row_formats(dtype, hidden):
    """(dispatch payload bytes, dispatch scale bytes, combine row bytes) of one token row."""
    if dtype == "fp8":
        return hidden, -(-hidden // 128) * 4, hidden * 2  # fp8 buffers combine in bf16
    size = {"bf16": 2, "fp32": 4}[dtype]
    return hidden * size, 0, hidden * size


def window_bytes(dtype, hidden, ranks, local_experts, topk, max_tokens, latency):
    """Bytes of one rank's window (both parity halves and the flags)."""
    xb, sb, rb = row_formats(dtype, hidden)
    tp = ranks * max_tokens
    lat = local_experts * tp if latency else 0
    off = 0

    def take(n):
        nonlocal off
        off = _up(off + n, _LINE)

    count_record = _up(_up(12 + 4 * local_experts, 8) + _TAG, _LINE)
    take(ranks * count_record)
    for n in (tp * xb, tp * sb, tp * 16, tp * topk * 4, tp * topk * 4, tp * _TAG,
              lat * xb, lat * sb, lat * _LATENCY_RECORD, lat * 16):
        take(n)
    comb = max(tp, lat)
    take(comb * rb)
    take(comb * _TAG)
    take(max(tp, max_tokens * topk) * rb)
    off = 2 * _up(off, _PAGE)
    take(2 * ranks * _TAG)
    take(_STAGE_SLOTS * ranks * _LINE)
    take(ranks * _TAG)
    # Elastic EP's membership records, one per rank (protocol.hpp MemberRecord: 7 words and a
    # view word per rank, a cache line multiple).
    take(ranks * _up((7 + ranks) * _TAG, _LINE))
    return off


def max_tokens_for(budget, dtype, hidden, ranks, local_experts, topk):
    """The largest max_tokens_per_rank whose throughput window fits in ``budget`` bytes (0 if
    not even one token does)."""
    def fits(t):
        return window_bytes(dtype, hidden, ranks, local_experts, topk, t, False) <= budget
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def topk_capacity(k, ranks):
    """The top-k a window is made for: at least k and the ranks (a dispatch without topk_idx
    routes with one column per rank), rounded up to 8 so calls with a different k share it."""
    return _up(max(int(k), int(ranks), 1), 8)


def check_fits(what, need, budget_name, budget, detail):
    if need > budget:
        raise _ubep.InvalidArgument(
            f"{what}: {detail} needs {need} bytes per rank, but the Buffer was made with "
            f"{budget_name}={budget}")
