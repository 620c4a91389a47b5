"""ubep.deep_ep's API on thread ranks: byte budgets, errors, what is not supported, DeepEP's
tuple shapes; and native fp8 in ubep.Buffer, bit-identical to the independent fp8 model."""
import numpy as np
import pytest
import torch

import fp8_reference as f8
import ubep
import ubep.deep_ep as deep_ep
from ubep._deep_ep_sizing import topk_capacity, window_bytes

T, H, E, K = 8, 256, 8, 2


def routing(rank, tokens=T):
    g = torch.Generator().manual_seed(rank + 11)
    idx = torch.topk(torch.rand((tokens, E), generator=g), K, dim=-1).indices
    idx[0, 1] = -1
    return idx, torch.rand((tokens, K), generator=g)


def x_of(rank, tokens=T):
    x = torch.full((tokens, H), float(rank + 1))
    x[:, -128:] = torch.arange(tokens, dtype=torch.float32).view(-1, 1)
    return x.to(torch.bfloat16)


def on_threads(n, fn):
    return ubep.run_on_threads(n, fn, timeout=30.0)


@pytest.mark.parametrize("dtype,latency", [("bf16", True), ("fp8", True), ("bf16", False),
                                           ("fp32", False)])
@pytest.mark.parametrize("tokens", [T, 2048])
def test_window_formula_matches_the_library(dtype, latency, tokens):
    """The budget arithmetic (a mirror of src/protocol/protocol.hpp's WindowLayout) agrees with the
    bytes the library maps; if it drifts, this fails (the Buffer checks the real bytes too).
    With 2048 tokens a byte per row is more than the page rounding of the halves hides (it
    was: the latency records were mirrored as 21 bytes a row, not 24)."""
    def body(group):
        kcap = topk_capacity(K, 1 if latency else 2)
        b = ubep.Buffer(group, hidden=H, num_experts=E, max_tokens_per_rank=tokens,
                        max_topk=kcap, dtype=dtype, enable_latency_layout=latency)
        return b.shared_bytes, window_bytes(dtype, H, 2, E // 2, kcap, tokens, latency)
    for real, est in on_threads(2, body):
        assert real == est


def test_low_latency_budget_and_handles():
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, 2, E)

    def body(group):
        small = deep_ep.Buffer(group, 0, hint // 2, low_latency_mode=True, num_qps_per_rank=4)
        idx, w = routing(group.rank)
        with pytest.raises(ubep.InvalidArgument, match=r"num_rdma_bytes=\d+.*|needs \d+ bytes"):
            small.low_latency_dispatch(x_of(group.rank), idx, T, E, use_fp8=False)
        buf = deep_ep.Buffer(group, 0, hint, low_latency_mode=True, num_qps_per_rank=4)
        recv, count, handle, event, hook = buf.low_latency_dispatch(x_of(group.rank), idx, T, E,
                                                                    use_fp8=False)
        assert hook is None and isinstance(event, deep_ep.EventOverlap)
        assert count.dtype == torch.int32 and recv.shape == (E // 2, 2 * T, H)
        src_info, layout_range, t, h, e = handle
        assert (t, h, e) == (T, H, E) and src_info.dtype == torch.int32
        assert layout_range.dtype == torch.int64
        assert ((layout_range & 0xFFFFFFFF).sum(dim=1) == count.to(torch.int64)).all()
        with pytest.raises(NotImplementedError, match="LogFMT"):
            buf.low_latency_combine(recv, idx, w, handle, use_logfmt=True)
        with pytest.raises(NotImplementedError, match="dispatch_wait_recv_cost_stats"):
            buf.low_latency_dispatch(x_of(group.rank), idx, T, E,
                                     dispatch_wait_recv_cost_stats=torch.zeros(2, 2))
        with pytest.raises(ubep.InvalidArgument, match="handle must be the tuple"):
            buf.low_latency_combine(recv, idx, w, tuple(handle))
        y, _, _ = buf.low_latency_combine(recv, idx, w, handle)
        native = handle._dispatch
        # A repeated combine, natively: no replayed dispatch (the same ubep handle), the same
        # bits; then with other expert outputs (zero-copy) and the first again.
        y2, _, _ = buf.low_latency_combine(recv, idx, w, handle)
        assert handle._dispatch is native and torch.equal(y, y2)
        buf.get_next_low_latency_combine_buffer(handle)[:] = recv * 2
        y3, _, _ = buf.low_latency_combine(None, idx, w, handle, zero_copy=True)
        y4, _, _ = buf.low_latency_combine(recv, idx, w, handle)
        assert handle._dispatch is native and torch.equal(y4, y)
        assert torch.equal(y3, y * 2)  # doubling is exact in fp32 and bf16
        return True
    assert all(on_threads(2, body))


def test_low_latency_repeated_shape_same_results():
    """The second call of a shape takes the cached path (_deep_ep_ll._Fast: one native call per
    dispatch and combine); its results are the first (checked) call's, bit for bit: recv_x,
    counts, the handle's received src_info rows and layout ranges, stats, and combine with and
    without zero_copy, into a new tensor and into ``out``."""
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, 2, E)

    def body(group):
        buf = deep_ep.Buffer(group, 0, hint, low_latency_mode=True, num_qps_per_rank=4)
        idx, w = routing(group.rank)
        x = x_of(group.rank)
        got = []
        for i in range(3):
            stats = torch.zeros(E // 2, dtype=torch.int32)
            recv, count, handle, event, hook = buf.low_latency_dispatch(
                x, idx, T, E, cumulative_local_expert_recv_stats=stats, use_fp8=False)
            assert hook is None and isinstance(event, deep_ep.EventOverlap)
            assert (handle.__dict__.get("_fast") is not None) == (i > 0)
            assert torch.equal(stats, count) and count.dtype == torch.int32
            rows = [handle[0][e, :int(count[e])].clone() for e in range(E // 2)]
            r = recv.clone()
            buf.get_next_low_latency_combine_buffer(handle)[:] = recv * 2
            out = torch.empty((T, H), dtype=torch.bfloat16) if i == 2 else None
            y, _, hook = buf.low_latency_combine(None, idx, w, handle, zero_copy=True, out=out)
            assert hook is None and (out is None or y is out)
            y2, _, _ = buf.low_latency_combine(recv, idx, w, handle)   # again: not zero-copy
            assert torch.equal(y2 * 2, y)
            got.append((r, count, rows, handle[1].clone(), y, y2))
        for a in got[1:]:
            assert torch.equal(a[0], got[0][0]) and torch.equal(a[1], got[0][1])
            assert all(torch.equal(p, q) for p, q in zip(a[2], got[0][2]))
            assert all(torch.equal(p, q) for p, q in zip(a[3:], got[0][3:]))
        # A combine with another topk_idx object (same values) or a first combine that is not
        # zero-copy: the same bits.
        recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False)
        y, _, _ = buf.low_latency_combine(recv * 2, idx.clone(), w, handle)
        assert torch.equal(y, got[0][4])
        recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False)
        y, _, _ = buf.low_latency_combine(recv * 2, idx, w, handle)
        assert torch.equal(y, got[0][4])
        # An older handle after a newer dispatch: replayed (the general path), the same bits.
        old = handle
        buf.low_latency_dispatch(x, idx, T, E, use_fp8=False)
        y, _, _ = buf.low_latency_combine(recv * 2, idx, w, old)
        assert torch.equal(y, got[0][4])
        return True
    assert all(on_threads(2, body))


def test_not_supported_raise_naming_the_feature():
    def body(group):
        # The mask API is supported now (python/tests/test_elastic.py).
        buf = deep_ep.Buffer(group, 0, 1 << 20, low_latency_mode=True, explicitly_destroy=True)
        with pytest.raises(NotImplementedError, match="get_local_buffer_tensor"):
            buf.get_local_buffer_tensor(torch.bfloat16)
        with pytest.raises(NotImplementedError, match="internode_dispatch"):
            buf.internode_dispatch(x_of(0))
        with pytest.raises(NotImplementedError, match="internode_combine"):
            buf.internode_combine(x_of(0), None)
        event, ran = deep_ep.Buffer.capture(), []
        event.register_hook_after_wait(lambda: ran.append(1))
        with event(release_handle=True):  # DeepEP's form: the hook runs on exit
            assert not ran
        assert ran == [1]
        buf.clean_low_latency_buffer(T, H, E)  # nothing to clean: epoch tags
        buf.destroy()
        assert not buf.is_available()
        with pytest.raises(ubep.InvalidArgument, match="destroyed"):
            buf.low_latency_dispatch(x_of(0), routing(0)[0], T, E)
        return True
    assert all(on_threads(2, body))
    with pytest.raises(ValueError, match="num_sms"):
        deep_ep.Config(3)


def test_normal_repeated_combine_is_native():
    """A normal-mode dispatch combined twice: the second combine replays nothing (the same
    ubep handle) and doubling the input doubles the result exactly."""
    def body(group):
        buf = deep_ep.Buffer(group, window_bytes("bf16", H, 2, E // 2, topk_capacity(K, 2), T,
                                                 False))
        idx, w = routing(group.rank)
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
        recv, _, _, _, handle, _ = buf.dispatch(x_of(group.rank), num_tokens_per_rank=per_rank,
                                                is_token_in_rank=in_rank,
                                                num_tokens_per_expert=per_expert, topk_idx=idx,
                                                topk_weights=w)
        native = handle._dispatch
        y, _, _ = buf.combine(recv, handle)
        y2, _, _ = buf.combine(recv * 2, handle)
        y3, _, _ = buf.combine(recv, handle)
        assert handle._dispatch is native
        assert torch.equal(y2, y * 2) and torch.equal(y3, y)
        return True
    assert all(on_threads(2, body))


def test_normal_budget_names_what_does_not_fit():
    def body(group):
        one = window_bytes("bf16", H, 2, E // 2, topk_capacity(K, 2), 4, False)
        buf = deep_ep.Buffer(group, one)  # holds 4 tokens per rank
        idx, w = routing(group.rank)
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
        with pytest.raises(ubep.InvalidArgument, match=r"8 tokens exceed the 4 tokens per rank"):
            buf.dispatch(x_of(group.rank), num_tokens_per_rank=per_rank,
                         is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                         topk_idx=idx, topk_weights=w)
        bad = in_rank.clone()
        bad[3] = ~bad[3]
        big = deep_ep.Buffer(group, one * 4)
        with pytest.raises(ubep.InvalidArgument, match="is_token_in_rank row 3"):
            big.dispatch(x_of(group.rank), num_tokens_per_rank=per_rank, is_token_in_rank=bad,
                         num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
        with pytest.raises(ubep.InvalidArgument, match="num_tokens_per_rank, is_token_in_rank"):
            big.dispatch(x_of(group.rank), topk_idx=idx, topk_weights=w)
        r = big.dispatch(x_of(group.rank), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                         num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w,
                         expert_alignment=4, num_worst_tokens=2 * T)
        recv_x, recv_idx, _, counts, handle, _ = r
        assert counts == [] and recv_x.shape[0] == 2 * T and recv_idx.dtype == torch.int64
        assert isinstance(handle, tuple) and len(handle) == 6
        rows = int(handle[0][-1][group.rank])
        assert (recv_idx[rows:] == -1).all() and (recv_idx[:rows] >= -1).all()
        return True
    assert all(on_threads(2, body))


@pytest.mark.parametrize("layout", ["latency", "throughput"])
@pytest.mark.parametrize("pow2", [False, True])
def test_native_fp8_bit_identical(layout, pow2):
    """ubep.Buffer(dtype="fp8"): casting on send (the C++ codec) and dispatching the caller's
    (codes, scales) give the same bits, and both match the independent model."""
    def body(group):
        r = group.rank
        buf = ubep.Buffer(group, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K,
                          dtype="fp8", fp8_round_scale=pow2)
        idx, w = routing(r)
        x = (x_of(r).float() * torch.linspace(-3, 3, H)).to(torch.bfloat16)
        codes, scales = f8.quantize(x.float().numpy(), pow2)
        out = []
        for xin, xs in ((x, None), (torch.from_numpy(codes), torch.from_numpy(scales))):
            res = buf.dispatch(xin, idx, w, x_scales=xs, layout=layout, copy=True)
            c, s = res.recv_x, res.recv_x_scales
            if layout == "latency":
                rng = res.recv_range.clone()
                out.append([(c[e, b:b + k].clone(), s[e, b:b + k].clone(),
                             res.recv_src[e, b:b + k].clone())
                            for e in range(E // 2) for b, k in rng[e].tolist()])
            else:
                out.append([(c, s, res.recv_src.clone())])
        return out
    results = on_threads(2, body)
    xs = [(x_of(r).float() * torch.linspace(-3, 3, H)).to(torch.bfloat16) for r in range(2)]
    refs = [f8.quantize(x.float().numpy(), pow2) for x in xs]
    for cast, given in results:
        for (c1, s1, src), (c2, s2, _) in zip(cast, given):
            c1 = c1.view(torch.uint8) if c1.dtype != torch.uint8 else c1
            c2 = c2.view(torch.uint8) if c2.dtype != torch.uint8 else c2
            assert torch.equal(c1, c2) and torch.equal(s1, s2)
            for row, (sr, st) in enumerate(src.tolist()):
                assert (c1[row].numpy() == refs[sr][0][st]).all()
                assert (s1[row].numpy() == refs[sr][1][st]).all()


def test_native_fp8_errors():
    def body(group):
        idx, _ = routing(group.rank)
        b16 = ubep.Buffer(group, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
        codes = torch.zeros((T, H), dtype=torch.uint8)
        with pytest.raises(ubep.InvalidArgument, match="dtype='fp8'"):
            b16.dispatch(codes, idx, x_scales=torch.ones((T, 2)), layout="latency")
        with pytest.raises(ubep.InvalidArgument, match="buffer's dtype is bf16"):
            b16.dispatch(codes, idx, x_scales=torch.ones((T, 2)))
        b8 = ubep.Buffer(group, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K,
                         dtype="fp8")
        with pytest.raises(ubep.InvalidArgument, match="must be bfloat16 or float32"):
            b8.dispatch(x_of(0).half(), idx, layout="latency")  # values to cast: bf16/fp32
        with pytest.raises(ubep.InvalidArgument, match="x_scales"):
            b8.dispatch(codes, idx, x_scales=torch.ones((T, 3)))
        with pytest.raises(ubep.InvalidArgument, match="fp8 codes must be"):
            b8.dispatch(torch.zeros((T, H), dtype=torch.int32), idx, x_scales=torch.ones((T, 2)))
        return True
    assert all(on_threads(2, body))


def test_fp8_model_matches_known_codes():
    """The model itself, on values whose e4m3 codes are known by hand."""
    v = np.array([0, 1, -1, 448, 1000, -448, 2 ** -9, 0.5, 1.0625, np.nan], dtype=np.float32)
    assert f8.encode(v).tolist() == [0, 0x38, 0xB8, 0x7E, 0x7E, 0xFE, 1, 0x30, 0x38, 0x7F]
