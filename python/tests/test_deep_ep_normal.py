"""ubep.deep_ep's normal mode in one native call (get_dispatch_layout, dispatch, and Megatron's
backward calls: the cached dispatch and the combine with topk_weights): the layout, DeepEP's
handle arrays, the cached dispatch's rows and the combined weights against references computed
here with plain loops from the routing, the layout arguments checked against the routing, a
failed call leaving earlier handles right, and result blocks reused from earlier calls holding
only their own call's values."""
import numpy as np
import pytest
import torch

import ubep
import ubep.deep_ep as deep_ep
from ubep import _arrays
from ubep._deep_ep_sizing import topk_capacity, window_bytes

H, E, K, R = 256, 8, 3, 2
EL = E // R


def routing(rank, tokens, seed=0):
    g = torch.Generator().manual_seed(rank * 101 + seed)
    idx = torch.topk(torch.rand((tokens, E), generator=g), K, dim=-1).indices
    if tokens > 2:
        idx[1, 0] = -1  # a dropped choice
        idx[2, :] = -1  # a token going nowhere
    return idx


def x_of(rank, tokens, hidden=H, shift=0):
    """A rank's rows: rank + 1 + shift in every channel but the last, which holds the token."""
    x = torch.full((tokens, hidden), float(rank + 1 + shift))
    x[:, -1] = torch.arange(tokens, dtype=torch.float32)
    return x.to(torch.bfloat16)


def layout_reference(idx, experts, ranks):
    """(tokens per rank, tokens per expert, ranks per token) by loops over topk_idx."""
    per_rank, per_expert = [0] * ranks, [0] * experts
    in_rank = [[False] * ranks for _ in range(idx.shape[0])]
    for t, row in enumerate(idx.tolist()):
        for e in row:
            if e >= 0:
                per_expert[e] += 1
                in_rank[t][e // (experts // ranks)] = True
        for r in range(ranks):
            per_rank[r] += in_rank[t][r]
    return per_rank, per_expert, in_rank


@pytest.mark.parametrize("tokens", [0, 1, 5, 300])
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_layout_matches_the_loops_and_the_other_paths(tokens, ranks):
    idx = routing(ranks, tokens, seed=tokens)
    per_rank, none, per_expert, in_rank = deep_ep._normal.get_dispatch_layout(idx, E, ranks)
    want_rank, want_expert, want_in = layout_reference(idx, E, ranks)
    assert none is None
    assert per_rank.dtype == torch.int32 and per_rank.tolist() == want_rank
    assert per_expert.dtype == torch.int32 and per_expert.tolist() == want_expert
    assert in_rank.dtype == torch.bool and in_rank.tolist() == want_in
    assert tuple(in_rank.shape) == (tokens, ranks)
    # the torch-ops path (CUDA tensors, other dtypes) and the NumPy path agree
    for other in (_arrays.dispatch_layout_torch(idx.to(torch.int32), E, ranks),
                  deep_ep._normal.get_dispatch_layout(idx.numpy(), E, ranks)):
        assert [np.asarray(a).tolist() for a in (other[0], other[2], other[3])] == \
            [want_rank, want_expert, want_in]


def test_layout_names_a_bad_expert_id():
    idx = routing(0, 6)
    idx[4, 1] = E
    with pytest.raises(ubep.InvalidArgument, match=rf"expert id {E} outside \[-1, {E}\)"):
        deep_ep._normal.get_dispatch_layout(idx, E, R)
    idx[4, 1] = -2
    with pytest.raises(ubep.InvalidArgument, match=r"expert id -2 outside"):
        deep_ep._normal.get_dispatch_layout(idx, E, R)
    with pytest.raises(ubep.InvalidArgument, match="num_experts 8 is not a multiple of the 3"):
        deep_ep._normal.get_dispatch_layout(routing(0, 6), E, 3)


def buffer(group, tokens=16):
    return deep_ep.Buffer(group, window_bytes("bf16", H, R, EL, topk_capacity(K, R), tokens,
                                              False))


@pytest.mark.parametrize("with_topk", [True, False])
def test_handle_arrays_match_the_routing(with_topk):
    """DeepEP's handle (rank_prefix_matrix, channel_prefix_matrix, recv_channel_prefix_matrix,
    recv_src_idx, is_token_in_rank, send_head), the counts per expert (aligned) and the rows,
    from every rank's routing; without topk_idx the rows go where is_token_in_rank says."""
    tokens = {0: 7, 1: 5}
    idx_of = {r: routing(r, tokens[r], seed=3) for r in range(R)}
    lay = {r: layout_reference(idx_of[r], E, R) for r in range(R)}

    def body(group):
        me = group.rank
        buf = buffer(group)
        idx = idx_of[me]
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
        kw = dict(topk_idx=idx, topk_weights=torch.rand(idx.shape)) if with_topk else {}
        recv, r_idx, r_w, counts, handle, _ = buf.dispatch(
            x_of(me, tokens[me]), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, expert_alignment=4, **kw)
        prefix, channel, begins, src_idx, in_rank_h, send_head = handle
        sent = [[t for t in range(tokens[s]) if lay[s][2][t][me]] for s in range(R)]
        acc = [0] * R
        want_prefix = []
        for s in range(R):
            acc = [acc[j] + lay[s][0][j] for j in range(R)]
            want_prefix.append(list(acc))
        assert prefix.dtype == torch.int32 and prefix.tolist() == want_prefix
        assert channel.tolist() == [[0]] * R
        starts = [sum(len(sent[j]) for j in range(s)) for s in range(R)]
        assert begins.dtype == torch.int32 and begins.view(-1).tolist() == starts
        assert src_idx.dtype == torch.int32 and src_idx.tolist() == sent[0] + sent[1]
        assert torch.equal(in_rank_h, in_rank)
        want_head = []
        seen = [0] * R
        for t in range(tokens[me]):
            row = []
            for r in range(R):
                row.append(seen[r] if lay[me][2][t][r] else -1)
                seen[r] += lay[me][2][t][r]
            want_head.append(row)
        assert send_head.dtype == torch.int32 and send_head.tolist() == want_head
        per_local = [sum(lay[s][1][me * EL + e] for s in range(R)) for e in range(EL)]
        if with_topk:
            assert counts == [-(-c // 4) * 4 for c in per_local]
            assert r_idx.dtype == torch.int64 and r_w.dtype == torch.float32
        else:
            assert counts == [-(-c // 4) * 4 for c in per_local] and r_idx is None
        for s in range(R):
            for p, t in enumerate(sent[s]):
                assert torch.equal(recv[starts[s] + p], x_of(s, tokens[s])[t])
                if with_topk:
                    ids = idx_of[s][t].tolist()
                    want = [e - me * EL if e >= 0 and e // EL == me else -1 for e in ids]
                    assert r_idx[starts[s] + p].tolist() == want
        # the combine sums each token's rows over its ranks
        y, _, _ = buf.combine(recv, handle)
        n = in_rank.sum(dim=1, keepdim=True).float()
        assert torch.equal(y.float(), x_of(me, tokens[me]).float() * n)
        return True
    assert all(ubep.run_on_threads(R, body, timeout=30.0))


@pytest.mark.parametrize("device", [None, "cuda-sim"])
def test_layout_arguments_are_checked_and_a_failed_call_leaves_handles_right(device):
    """The same checks on the native path (host windows) and the torch one (GPU windows, here
    the simulated GPU)."""
    def body(group):
        me = group.rank
        buf = deep_ep.Buffer(group, window_bytes("bf16", H, R, EL, topk_capacity(K, R), 16,
                                                 False), device=device, explicitly_destroy=True)
        idx = routing(me, 8, seed=5)
        w = torch.ones(idx.shape)
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
        good = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                    num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
        recv, _, _, _, handle, _ = buf.dispatch(x_of(me, 8), **good)

        def bad(match, **change):
            with pytest.raises(ubep.InvalidArgument, match=match):
                buf.dispatch(x_of(me, 8) * 3, **dict(good, **change))
        flipped = in_rank.clone()
        flipped[4, 1] = not bool(flipped[4, 1])
        bad(r"is_token_in_rank row 4 marks ranks \[.*\], topk_idx row 4 goes to ranks",
            is_token_in_rank=flipped)
        pr = per_rank.clone()
        pr[1] += 1
        bad(rf"num_tokens_per_rank\[1\] is {int(pr[1])}, is_token_in_rank marks {int(per_rank[1])}",
            num_tokens_per_rank=pr)
        pe = per_expert.clone()
        pe[6] += 2
        bad(rf"num_tokens_per_expert\[6\] is {int(pe[6])}, topk_idx routes {int(per_expert[6])}",
            num_tokens_per_expert=pe)
        bad(r"is_token_in_rank must be \[8, 2\]", is_token_in_rank=in_rank[:7])
        bad(r"expert id \d outside \[-1, 4\)", num_tokens_per_expert=per_expert[:4])
        bad(r"num_tokens_per_rank must have 2 entries", num_tokens_per_rank=per_rank[:1])
        bad(r"topk_weights", topk_weights=torch.ones(idx.shape, dtype=torch.float64))
        # failed checks dispatched nothing: the handle's dispatch is still the window's last,
        # combined in place (no replay)
        first = handle._dispatch
        y0, _, _ = buf.combine(recv, handle)
        assert handle._dispatch is first
        n = in_rank.sum(dim=1, keepdim=True).float()
        assert torch.equal(y0.float(), x_of(me, 8).float() * n)
        # int64 counts are taken as DeepEP's int32 ones
        again, _, _, _, handle2, _ = buf.dispatch(
            x_of(me, 8) * 2, **dict(good, num_tokens_per_rank=per_rank.long(),
                                    num_tokens_per_expert=per_expert.long()))
        # the older handle replays its own dispatch: its rows, not the failed calls' or the last
        y, _, _ = buf.combine(recv, handle)
        y2, _, _ = buf.combine(again, handle2)
        assert torch.equal(y.float(), x_of(me, 8).float() * n)
        assert torch.equal(y2.float(), x_of(me, 8).float() * 2 * n)
        del recv, again, handle, handle2, y, y0, y2
        buf.destroy()  # each rank on its own thread (a cuda-sim window's teardown meets its peers')
        return True
    assert all(ubep.run_on_threads(R, body, timeout=30.0))


@pytest.mark.parametrize("tokens,hidden", [(600, 2048), (700, 7168)])
def test_reused_result_blocks_hold_only_their_own_call(tokens, hidden):
    """recv_x and combined_x from 2 MiB up come from blocks freed by earlier calls (no page
    zeroing): each call's results are its own rows, a token sent nowhere combines to zeros and
    not to what an earlier call left in the block. 600 x 2048: recv_x ~4.5 MB, combined_x 2.4
    MB; 700 x 7168: recv_x ~19 MB, copied out and staged for the combine with non-temporal
    stores (from 16 MiB)."""
    from ubep import _ubep

    def body(group):
        me = group.rank
        buf = deep_ep.Buffer(group, window_bytes("bf16", hidden, R, EL, topk_capacity(K, R),
                                                 tokens, False))
        reused_before = _ubep._huge_block_cache()[2]
        for i in range(5):
            idx = routing(me, tokens, seed=i)
            idx[5 + i, :] = -1  # sent nowhere (row 2 is too)
            per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
            recv, _, _, _, handle, _ = buf.dispatch(
                x_of(me, tokens, hidden, i), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=torch.ones(idx.shape))
            begins = handle[2].view(-1).tolist() + [recv.shape[0]]
            for s in range(R):
                rows = recv[begins[s]:begins[s + 1]]
                assert (rows[:, :-1] == float(s + 1 + i)).all()
            y, _, _ = buf.combine(recv, handle)
            n = in_rank.sum(dim=1, keepdim=True).float()
            assert torch.equal(y[:, :-1].float(), (n * float(me + 1 + i)).expand(-1, hidden - 1))
            assert (y[n.view(-1) == 0] == 0).all()
            del recv, y, handle
            group.barrier()
        return _ubep._huge_block_cache()[2] - reused_before
    # both ranks' blocks share the process's cache: reused at least once per later call
    assert sum(ubep.run_on_threads(R, body, timeout=60.0)) >= 4


def fp8_of(rank, tokens, shift=0):
    """fp8 codes and scales for DeepEP's (codes, scales) x: codes from the rank, the token and
    the shift, one scale per 128 channels (the values do not matter, only that they arrive)."""
    codes = (torch.arange(H).view(1, H) + torch.arange(tokens).view(-1, 1) * 7 + rank * 31 +
             shift) % 112 + 8  # no NaN codes (0x7f / 0xff)
    scales = torch.full((tokens, H // 128), float(rank + 1 + shift)) + \
        torch.arange(tokens, dtype=torch.float32).view(-1, 1)
    return codes.to(torch.uint8), scales


def grad_weights(me, source, token, k):
    """The weight gradient rank `me` passes back for `source`'s token: exact in fp32 when
    summed."""
    return [float(me * 1000 + source * 100 + token * 4 + j) for j in range(k)]


@pytest.mark.parametrize("device", [None, "cuda-sim"])
@pytest.mark.parametrize("with_topk", [True, False])
def test_cached_dispatch_and_combine_with_weights_match_the_routing(device, with_topk):
    """Megatron's backward calls: a cached dispatch (handle=) sends new rows (bf16, and fp8
    codes through another window) along the handle's routing, and a combine with topk_weights
    sums each token's weights over the ranks it went to (DeepEP's combined_topk_weights), for
    the last dispatch and for an older one that a later dispatch replaced; references from
    every rank's routing. The host path is one native call each, the simulated GPU's the torch
    one: both must match."""
    tokens = {0: 9, 1: 6}
    idx_of = {r: routing(r, tokens[r], seed=7) for r in range(R)}
    lay = {r: layout_reference(idx_of[r], E, R) for r in range(R)}

    def body(group):
        me = group.rank
        buf = deep_ep.Buffer(group, 2 * window_bytes("bf16", H, R, EL, topk_capacity(K, R), 16,
                                                     False), device=device,
                             explicitly_destroy=True)
        idx = idx_of[me]
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
        kw = dict(topk_idx=idx, topk_weights=torch.rand(idx.shape)) if with_topk else {}
        layout = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                      num_tokens_per_expert=per_expert, **kw)
        recv, _, _, _, handle, _ = buf.dispatch(x_of(me, tokens[me]), **layout)
        sent = [[t for t in range(tokens[s]) if lay[s][2][t][me]] for s in range(R)]
        order = [(s, t) for s in range(R) for t in sent[s]]  # the received rows
        k = K if with_topk else R
        n = in_rank.sum(dim=1, keepdim=True).float()

        def check_weighted_combine(h, rows, shift):
            gw = torch.tensor([grad_weights(me, s, t, k) for s, t in order]).view(-1, k)
            y, cw, _ = buf.combine(rows, h, topk_weights=gw)
            assert torch.equal(y.float(), x_of(me, tokens[me], shift=shift).float() * n)
            want = [[sum(grad_weights(r, me, t, k)[j] for r in range(R) if lay[me][2][t][r])
                     for j in range(k)] for t in range(tokens[me])]
            assert cw.dtype == torch.float32 and cw.tolist() == want

        for shift in (3, 4):  # twice: the second finds the windows as the first left them
            again = buf.dispatch(x_of(me, tokens[me], shift=shift), handle=handle)[0]
            assert again.shape == recv.shape
            for i, (s, t) in enumerate(order):
                assert torch.equal(again[i], x_of(s, tokens[s], shift=shift)[t])
            check_weighted_combine(handle, again, shift)
        if device is None:  # fp8 windows are the CPU's (the CUDA kernels send bf16 and fp32)
            codes, scales = buf.dispatch(fp8_of(me, tokens[me]), handle=handle)[0]
            for i, (s, t) in enumerate(order):
                want_codes, want_scales = fp8_of(s, tokens[s])
                assert torch.equal(codes[i].view(torch.uint8), want_codes[t])
                assert torch.equal(scales[i], want_scales[t])
        # A later dispatch replaced the handle's: its combine replays the handle's rows
        recv2, _, _, _, handle2, _ = buf.dispatch(x_of(me, tokens[me], shift=9), **layout)
        check_weighted_combine(handle, recv, 0)
        check_weighted_combine(handle2, recv2, 9)
        del recv, recv2, again, handle, handle2
        buf.destroy()
        return True
    assert all(ubep.run_on_threads(R, body, timeout=60.0))


def test_backward_calls_check_their_arguments_and_a_failed_call_leaves_them_right():
    """A cached dispatch of another token count and a combine with topk_weights of the wrong
    shape fail naming what they got, before any data moves: the calls after them return the
    right rows and weights (float64 weights taken as fp32)."""
    def body(group):
        me = group.rank
        buf = buffer(group)
        idx = routing(me, 8, seed=11)
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
        recv, _, r_w, _, handle, _ = buf.dispatch(
            x_of(me, 8), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=torch.ones(idx.shape))
        rows = recv.shape[0]
        with pytest.raises(ubep.InvalidArgument,
                           match="x has 7 tokens, the handle's dispatch had 8"):
            buf.dispatch(x_of(me, 7), handle=handle)
        with pytest.raises(ubep.InvalidArgument,
                           match=rf"topk_weights must be \[received rows, k\], got \({rows},\)"):
            buf.combine(recv, handle, topk_weights=torch.ones(rows))
        with pytest.raises(ubep.InvalidArgument,
                           match=rf"topk_weights must be \[{rows}, {K}\] .*got fp32\[{rows + 1}, "):
            buf.combine(recv, handle, topk_weights=torch.ones((rows + 1, K)))
        again = buf.dispatch(x_of(me, 8, shift=2), handle=handle)[0]
        y, cw, _ = buf.combine(again, handle, topk_weights=r_w.double())  # float64: converted
        n = in_rank.sum(dim=1, keepdim=True).float()
        assert torch.equal(y.float(), x_of(me, 8, shift=2).float() * n)
        # the weights came as dispatched (ones where the rank holds the expert), summed
        assert torch.equal(cw, (idx >= 0).float())
        return True
    assert all(ubep.run_on_threads(R, body, timeout=30.0))
