"""ubep.deep_ep's native paths: the low-latency fast path for a shape seen before (one native
call makes the dispatch and DeepEP's handle tensors; a combine's new tensor is made natively),
and the normal mode's new result tensors made natively: what they must keep from the general
path. Received rows are checked against the senders' inputs
(x_of: a row holds its rank and token), not against another run of the library."""
import resource

import pytest
import torch

import fp8_reference as f8
import ubep
import ubep.deep_ep as deep_ep

T, H, E, K = 8, 256, 8, 2
R, EL = 2, E // 2


def x_of(rank, tokens=T, hidden=H, dtype=torch.bfloat16):
    x = torch.full((tokens, hidden), float(rank + 1))
    x[:, -1] = torch.arange(tokens, dtype=torch.float32)
    return x.to(dtype)


def routing(rank, seed=0, tokens=T, k=K):
    g = torch.Generator().manual_seed(rank * 31 + seed)
    return torch.topk(torch.rand((tokens, E), generator=g), k, dim=-1).indices


def check_received(me, recv, count, handle, idx_of, tokens=T):
    """Rank me's received rows are each its source's x row, at the place DeepEP's handle says,
    and the counts are the routing's (idx_of(rank): every rank's topk_idx)."""
    src_info, layout_range = handle[0], handle[1]
    for e in range(EL):
        expert = me * EL + e
        want = sum(int((idx_of(s) == expert).sum()) for s in range(R))
        assert int(count[e]) == want
        for s in range(R):
            packed = int(layout_range[e, s])
            begin, n = packed >> 32, packed & 0xFFFFFFFF
            assert n == int((idx_of(s) == expert).any(dim=1).sum())
            for p in range(begin, begin + n):
                t = int(src_info[e, p])
                assert 0 <= t < tokens and bool((idx_of(s)[t] == expert).any())
                assert torch.equal(recv[e, p], x_of(s, tokens, recv.shape[-1], recv.dtype)[t])


def on_threads(fn):
    return ubep.run_on_threads(R, fn, timeout=30.0)


def test_other_shapes_leave_the_fast_path_and_keep_their_checks():
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)

    def body(group):
        r = group.rank
        buf = deep_ep.Buffer(group, 0, 8 * hint, low_latency_mode=True, num_qps_per_rank=4)
        for i in range(3):  # the first call registers the shape, the others take the fast path
            recv, count, handle, _, _ = buf.low_latency_dispatch(
                x_of(r), routing(r, i), T, E, use_fp8=False)
            assert (handle.__dict__.get("_fast") is not None) == (i > 0)
            check_received(r, recv, count, handle, lambda s, i=i: routing(s, i))
        # fp32 x: its own window (a miss of the bf16 shape's native check), its own results.
        for i in range(2):
            recv, count, handle, _, _ = buf.low_latency_dispatch(
                x_of(r, dtype=torch.float32), routing(r, 5), T, E, use_fp8=False)
            assert recv.dtype == torch.float32
            check_received(r, recv, count, handle, lambda s: routing(s, 5))
        # Another top-k, another hidden size, a tensor subclass: the general path's results.
        recv, count, handle, _, _ = buf.low_latency_dispatch(
            x_of(r), routing(r, 6, k=1), T, E, use_fp8=False)
        check_received(r, recv, count, handle, lambda s: routing(s, 6, k=1))
        recv, count, handle, _, _ = buf.low_latency_dispatch(
            x_of(r, hidden=2 * H), routing(r, 9), T, E, use_fp8=False)
        check_received(r, recv, count, handle, lambda s: routing(s, 9))
        param = torch.nn.Parameter(x_of(r), requires_grad=False)
        recv, count, handle, _, _ = buf.low_latency_dispatch(param, routing(r, 7), T, E,
                                                             use_fp8=False)
        check_received(r, recv, count, handle, lambda s: routing(s, 7))
        # The checks of the registered shape still hold on the fast path.
        wide = torch.zeros((T, 2 * H), dtype=torch.bfloat16)
        with pytest.raises(ubep.InvalidArgument, match="contiguous"):
            buf.low_latency_dispatch(wide[:, :H], routing(r), T, E, use_fp8=False)
        bad = routing(r).clone()
        bad[0, 0] = E
        with pytest.raises(ubep.InvalidArgument, match=str(E)):
            buf.low_latency_dispatch(x_of(r), bad, T, E, use_fp8=False)
        # And the fast path after all of that.
        recv, count, handle, _, _ = buf.low_latency_dispatch(x_of(r), routing(r, 8), T, E,
                                                             use_fp8=False)
        assert handle.__dict__.get("_fast") is not None
        check_received(r, recv, count, handle, lambda s: routing(s, 8))
        return True
    assert all(on_threads(body))


@pytest.mark.parametrize("round_scale", [False, True])
def test_fp8_calls_take_the_fast_path_with_the_same_codes(round_scale):
    """DeepEP's default low-latency call (use_fp8=True: bf16 x cast on send) on the fast path:
    every received row's codes and scales are the independent model's quantization of its
    source's x row, on the first (checked) call and on the fast ones; its combine too."""
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)

    def values(rank):  # per-block magnitudes that differ, so the scales do
        return (x_of(rank).float() * torch.linspace(-3, 3, H)).to(torch.bfloat16)

    refs = [f8.quantize(values(s).float().numpy(), round_scale) for s in range(R)]

    def body(group):
        r = group.rank
        buf = deep_ep.Buffer(group, 0, 2 * hint, low_latency_mode=True, num_qps_per_rank=4)
        w = torch.rand((T, K), generator=torch.Generator().manual_seed(r))
        for i in range(3):
            idx = routing(r, i)
            (codes, scales), count, handle, _, hook = buf.low_latency_dispatch(
                values(r), idx, T, E, use_fp8=True, round_scale=round_scale)
            assert hook is None and (handle.__dict__.get("_fast") is not None) == (i > 0)
            assert scales.dtype == torch.float32 and codes.shape == (EL, R * T, H)
            codes = codes.view(torch.uint8)
            src_info, layout_range = handle[0], handle[1]
            for e in range(EL):
                for s in range(R):
                    packed = int(layout_range[e, s])
                    begin, n = packed >> 32, packed & 0xFFFFFFFF
                    assert n == int((routing(s, i) == r * EL + e).any(dim=1).sum())
                    for p in range(begin, begin + n):
                        t = int(src_info[e, p])
                        assert (codes[e, p].numpy() == refs[s][0][t]).all()
                        assert (scales[e, p].numpy() == refs[s][1][t]).all()
            assert int(count.sum()) == sum(int((routing(s, i) // EL == r).sum()) for s in range(R))
            # The expert: each row dequantized (the model's products), rounded to bf16.
            out = buf.get_next_low_latency_combine_buffer(handle)
            deq = f8.dequantize(codes.numpy(), scales.numpy())
            out.copy_(torch.from_numpy(deq).to(torch.bfloat16))
            y, _, _ = buf.low_latency_combine(out, idx, w, handle, zero_copy=True)
            # y[t] = sum over k (ascending) of w[t, k] * row(t, k), fp32, one rounding; every
            # row of token t is the same dequantized x row here.
            row = torch.from_numpy(f8.dequantize(refs[r][0], refs[r][1])).to(torch.bfloat16)
            acc = torch.zeros((T, H))
            for k in range(K):
                acc = acc + w[:, k:k + 1] * row.float()
            assert torch.equal(y, acc.to(torch.bfloat16))
        return True
    assert all(on_threads(body))


@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
def test_receive_hooks_on_the_fast_path(algorithm):
    """return_recv_hook=True (DeepEP's overlap): the fast path's dispatch and combine hooks. The
    received rows, counts, statistics and y are right once the hook has run (ubep: the split
    phase; bsp: done in the call, the hook only returns)."""
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)

    def body(group):
        r = group.rank
        buf = deep_ep.Buffer(group, 0, hint, low_latency_mode=True, num_qps_per_rank=4,
                             algorithm=algorithm)
        w = torch.rand((T, K), generator=torch.Generator().manual_seed(r))
        for i in range(3):
            idx = routing(r, i)
            stats = torch.zeros(EL, dtype=torch.int32)
            recv, count, handle, _, hook = buf.low_latency_dispatch(
                x_of(r), idx, T, E, use_fp8=False, return_recv_hook=True,
                cumulative_local_expert_recv_stats=stats)
            assert (handle.__dict__.get("_fast") is not None) == (i > 0)
            hook()
            check_received(r, recv, count, handle, lambda s, i=i: routing(s, i))
            assert torch.equal(stats, count)
            y, _, chook = buf.low_latency_combine(recv, idx, w, handle, return_recv_hook=True)
            chook()
            want = torch.zeros((T, H))
            for k in range(K):
                want = want + w[:, k:k + 1] * x_of(r).float()
            assert torch.equal(y, want.to(torch.bfloat16))
        return True
    assert all(on_threads(body))


def test_fast_handles_and_combines_are_new_tensors():
    """DeepEP's handle tensors and combine outputs are new at every call: an older handle's
    tensors and an older y keep their values through later calls."""
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)

    def body(group):
        r = group.rank
        buf = deep_ep.Buffer(group, 0, hint, low_latency_mode=True, num_qps_per_rank=4)
        w = torch.rand((T, K), generator=torch.Generator().manual_seed(r))
        buf.low_latency_dispatch(x_of(r), routing(r), T, E, use_fp8=False)  # registers
        kept = []
        for i in range(3):
            recv, count, handle, _, _ = buf.low_latency_dispatch(x_of(r), routing(r, i), T, E,
                                                                 use_fp8=False)
            assert handle.__dict__.get("_fast") is not None
            y, _, _ = buf.low_latency_combine(recv, routing(r, i), w, handle)
            kept.append((count, handle, y, [t.clone() for t in (count, handle[0], handle[1], y)]))
        for count, handle, y, copies in kept:
            for t, c in zip((count, handle[0], handle[1], y), copies):
                assert torch.equal(t, c)
        ptrs = [t.data_ptr() for count, handle, y, _ in kept for t in (count, handle[0], y)]
        assert len(set(ptrs)) == len(ptrs)
        # y against its definition: each token's rows come back unchanged (the identity
        # expert), weighted: y[t] = sum_k w[t, k] * x[t] in fp32, rounded once to bf16.
        want = (w.sum(dim=1, keepdim=True) * x_of(r).float()).to(torch.bfloat16)
        y = kept[0][2]
        assert torch.allclose(y.float(), want.float(), rtol=1e-2)
        return True
    assert all(on_threads(body))


def test_fast_calls_free_what_they_make():
    """The handle tensors and combine outputs the native calls make are freed with their last
    tensor: 400 calls of a shape whose handle and y take 1.2 MB a call leave the process's
    peak resident memory within 64 MB of where it was after the first 50."""
    tokens = 2048
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(tokens, H, R, E)

    def body(group):
        r = group.rank
        buf = deep_ep.Buffer(group, 0, hint, low_latency_mode=True, num_qps_per_rank=4)
        x, idx = x_of(r, tokens), routing(r, 0, tokens)
        w = torch.ones((tokens, K))
        peak = 0
        for i in range(450):
            recv, _, handle, _, _ = buf.low_latency_dispatch(x, idx, tokens, E, use_fp8=False)
            y, _, _ = buf.low_latency_combine(recv, idx, w, handle)
            if i == 49:
                group.barrier()  # both ranks' first 50 calls are in the peak
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        group.barrier()
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
        assert handle.__dict__.get("_fast") is not None and y.shape == (tokens, H)
        return grown
    for grown in on_threads(body):
        assert grown < 64 * 1024, f"peak resident memory grew by {grown} KiB"


def test_normal_mode_results_are_new_tensors_and_freed():
    """DeepEP's normal dispatch and combine return new tensors (made natively, in huge pages
    from 2 MiB): each holds its own call's rows after later calls, and 60 calls whose recv_x
    and y take 2.5 MB each leave peak memory within 64 MB of where it was after the first 10."""
    from ubep._deep_ep_sizing import topk_capacity, window_bytes
    tokens, hidden = 384, 2048  # recv_x: up to 768 rows of 4 KiB (2-3 MiB), y: 1.5 MiB

    def x_big(rank, seed):
        x = torch.full((tokens, hidden), float(rank + 1 + seed))
        x[:, -1] = torch.arange(tokens, dtype=torch.float32)
        return x.to(torch.bfloat16)

    def body(group):
        r = group.rank
        buf = deep_ep.Buffer(group, window_bytes("bf16", hidden, R, EL, topk_capacity(K, R),
                                                 tokens, False))
        kept, peak = [], 0
        for i in range(70):
            idx = routing(r, i % 3, tokens)
            w = torch.ones((tokens, K))
            per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
            recv, _, _, _, handle, _ = buf.dispatch(
                x_big(r, i), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
            y, _, _ = buf.combine(recv, handle)
            # Each received row is its source's x row: (source + 1 + i) in all but the last
            # channel, which holds the token; y is the sum over the token's ranks of its row.
            src = handle[3]
            begins = handle[2].view(-1).tolist() + [recv.shape[0]]
            for s in range(R):
                rows = recv[begins[s]:begins[s + 1]]
                assert (rows[:, :-1] == float(s + 1 + i)).all()
                assert torch.equal(rows[:, -1], src[begins[s]:begins[s + 1]].to(torch.bfloat16))
            ranks = in_rank.sum(dim=1, keepdim=True).float()
            assert torch.equal(y[:, :-1].float(), (ranks * float(r + 1 + i)).expand(-1, hidden - 1))
            if i < 3:
                kept.append((recv, y, recv.clone(), y.clone()))
            if i == 9:
                group.barrier()
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for recv, y, recv0, y0 in kept:
            assert torch.equal(recv, recv0) and torch.equal(y, y0)
        group.barrier()
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    for grown in on_threads(body):
        assert grown < 64 * 1024, f"peak resident memory grew by {grown} KiB"
