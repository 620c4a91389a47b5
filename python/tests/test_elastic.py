"""Elastic EP from Python (docs/ELASTIC.md) on thread ranks: ubep.Buffer.mask / masked_ranks /
rejoin, every call checked against the NumPy reference of the ranks it ran with (a masked
rank's experts dropped from every topk_idx, the masked rank sending nothing); and the DeepEP
mask API of ubep.deep_ep."""
import threading
import time

import numpy as np
import pytest

import reference as ref
import ubep
from worker import to_np

R, VICTIM = 3, 2
SPEC = ref.Spec(ranks=R, tokens=6, hidden=40, experts=6, topk=2, dtype="bf16", seed=21)


def masked_inputs(spec, its, masked):
    """Every rank's inputs of the call (rank r's of call its[r]), as the reference must see
    them with ``masked`` masked."""
    return ref.mask_inputs(spec, [ref.make_inputs(spec, r, its.get(r, 0)) for r in range(spec.R)],
                           masked)


def check_call(spec, rank, its, masked, got, what):
    xs, idxs, ws = masked_inputs(spec, its, masked)
    disp, where = ref.dispatch_latency(spec, xs, idxs)
    outs = [ref.make_expert_output(spec, d, its.get(d, 0), disp[d]["recv_x"].shape)
            for d in range(spec.R)]
    ys = ref.combine_latency(spec, where, outs, idxs, ws)
    exp = dict(disp[rank], y=ys[rank])
    v = exp["valid"]
    msg = f"{what}: rank {rank} its {its} masked {masked}"
    np.testing.assert_array_equal(got["recv_count"], exp["recv_count"], err_msg=msg)
    np.testing.assert_array_equal(got["recv_x"][v], exp["recv_x"][v], err_msg=msg)
    np.testing.assert_array_equal(got["recv_src"][v], exp["recv_src"][v], err_msg=msg)
    np.testing.assert_array_equal(got["y"], exp["y"], err_msg=msg)


def one_call(buf, rank, it):
    """A latency-layout dispatch + combine with this rank's inputs of call ``it``; the masked
    view the dispatch agreed, and what came back. A call that met a group change (the message
    names the agreement) is retried once with the same inputs, as docs/ELASTIC.md says."""
    x, idx, w = ref.make_inputs(SPEC, rank, it)
    for attempt in (0, 1):
        try:
            r = buf.dispatch(x, idx, w, layout="latency")
            recv_x = r.recv_x
            view = buf.masked_ranks()
            got = dict(recv_x=to_np(recv_x), recv_count=to_np(r.recv_count),
                       recv_src=to_np(r.recv_src))
            out = ref.make_expert_output(SPEC, rank, it, tuple(recv_x.shape))
            y = buf.combine(out, r.handle)
            got["y"] = to_np(y)
            return it, view, got
        except ubep.PeerFailedError as e:
            if attempt or "agree" not in str(e):
                raise
    raise AssertionError("unreachable")




@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
def test_mask_then_rejoin_matches_reference(algorithm):
    # A rank that fails leaves the barrier broken (timeout), so its peers fail instead of hang.
    sync = threading.Barrier(R, timeout=20)

    def body(g):
        me = g.rank
        buf = ubep.Buffer(g, hidden=SPEC.H, num_experts=SPEC.E, max_tokens_per_rank=SPEC.T,
                          max_topk=SPEC.K, dtype=SPEC.dtype, algorithm=algorithm, timeout=20.0)
        calls = {"full": one_call(buf, me, 0)}
        sync.wait()
        if me != VICTIM:
            buf.mask(VICTIM)  # every survivor, as DeepEP's low_latency_update_mask_buffer
            calls["masked"] = [one_call(buf, me, it) for it in (1, 2)]
            calls["masked_view"] = buf.masked_ranks()
        else:
            # Idle, its Buffer alive; it rejoins before the survivors go on, so their next
            # dispatch (or its retry) is the agreed full call.
            calls["masked_view"] = buf.masked_ranks()
            buf.rejoin()
        sync.wait()
        back = []
        # The survivors see the rejoin at a dispatch of their own: until then they go on masked
        # (bounded in time, not in calls: the victim's thread may start late on a loaded machine).
        deadline = time.monotonic() + 10
        for i in range(100000):
            back.append(one_call(buf, me, 20 + i))
            if me == VICTIM or not buf.masked_ranks() or time.monotonic() > deadline:
                break
        calls["back"] = back
        calls["final_view"] = buf.masked_ranks()
        return calls

    res = ubep.run_on_threads(R, body, timeout=30)
    everyone = {r: 0 for r in range(R)}
    for r in range(R):
        it, view, got = res[r]["full"]
        assert view == []
        check_call(SPEC, r, everyone, [], got, "full call")
    for r in range(R):
        if r == VICTIM:
            continue
        assert res[r]["masked_view"] == [VICTIM]
        for it, view, got in res[r]["masked"]:
            assert view == [VICTIM]
            check_call(SPEC, r, {0: it, 1: it}, [VICTIM], got, "masked call")
    # The full call after the rejoin: each survivor's last call and the victim's only one.
    victim_it = res[VICTIM]["back"][0][0]
    assert len(res[VICTIM]["back"]) == 1
    for r in range(R):
        assert res[r]["final_view"] == [], f"rank {r} still masks {res[r]['final_view']}"
        for n, (it, view, got) in enumerate(res[r]["back"]):
            if view:  # a survivor's call before it saw the rejoin: the two survivors
                assert view == [VICTIM] and n < len(res[r]["back"]) - 1
                check_call(SPEC, r, {0: it, 1: it}, [VICTIM], got, "call before the rejoin")
            else:
                last = {s: res[s]["back"][-1][0] for s in range(R) if s != VICTIM}
                check_call(SPEC, r, {**last, VICTIM: victim_it}, [], got,
                           "call after the rejoin")


def test_mask_arguments_name_the_rank():
    def body(g):
        buf = ubep.Buffer(g, hidden=8, num_experts=4, max_tokens_per_rank=4, max_topk=2)
        with pytest.raises(ubep.InvalidArgument, match="rank 7 out of range"):
            buf.mask(7)
        with pytest.raises(ubep.InvalidArgument, match=f"rank {g.rank} cannot mask itself"):
            buf.mask(g.rank)
        assert buf.masked_ranks() == []
        return True
    assert ubep.run_on_threads(2, body, timeout=30) == [True, True]


def test_peer_failed_error_is_a_ubep_error():
    assert issubclass(ubep.PeerFailedError, ubep.Error)


def test_deep_ep_mask_api():
    """ubep.deep_ep's update/query/clean on 3 thread ranks: a full call makes the window, ranks
    0 and 1 mask rank 2 and call on (checked against identity experts with rank 2's experts
    dropped), rank 2 rejoins through its windows and the next call is full again."""
    torch = pytest.importorskip("torch")
    import ubep.deep_ep as deep_ep
    T, H, E, K = 4, 128, 6, 2
    El = E // R
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)
    sync = threading.Barrier(R, timeout=20)

    def inputs(rank, it):
        g = torch.Generator().manual_seed(100 * it + rank)
        idx = torch.topk(torch.rand((T, E), generator=g), K, dim=-1).indices
        x = (torch.rand((T, H), generator=g) * 4 - 2).to(torch.bfloat16)
        return x, idx, torch.rand((T, K), generator=g)

    def call(buf, rank, it):
        """Identity experts: y[t] = sum over kept k of w[t, k] * x[t]; returns (y, want)."""
        x, idx, w = inputs(rank, it)
        for attempt in (0, 1):
            try:
                recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E,
                                                                     use_fp8=False)
                y, _, _ = buf.low_latency_combine(recv, idx, w, handle)
                break
            except ubep.PeerFailedError as e:
                if attempt or "agree" not in str(e):
                    raise
        status = torch.zeros(R, dtype=torch.int32)
        buf.low_latency_query_mask_buffer(status)
        keep = torch.ones_like(w)
        for m in torch.nonzero(status).flatten().tolist():
            keep[idx // El == m] = 0
        want = ((w * keep).sum(1, keepdim=True) * x.float())
        torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)
        return status.tolist()

    def body(g):
        me = g.rank
        buf = deep_ep.Buffer(g, 0, hint, low_latency_mode=True, num_qps_per_rank=1,
                             enable_shrink=True)
        assert buf.enable_shrink
        status = torch.full((R,), 7, dtype=torch.int32)
        buf.low_latency_query_mask_buffer(status)
        assert status.tolist() == [0, 0, 0]
        buf.low_latency_clean_mask_buffer()  # nothing masked: a no-op
        buf.low_latency_update_mask_buffer(0 if me else 1, mask=False)  # not masked: no-op
        with pytest.raises(ubep.InvalidArgument, match="rank 5 out of range"):
            buf.low_latency_update_mask_buffer(5, mask=True)
        with pytest.raises(ubep.InvalidArgument, match="shape"):
            buf.low_latency_query_mask_buffer(torch.zeros(R + 1, dtype=torch.int32))
        assert call(buf, me, 0) == [0, 0, 0]  # makes the window (collective)
        sync.wait()
        if me != VICTIM:
            buf.low_latency_update_mask_buffer(VICTIM, mask=True)
            status = torch.zeros(R, dtype=torch.int32)
            buf.low_latency_query_mask_buffer(status)  # shown at once, as DeepEP
            assert status.tolist() == [0, 0, 1]
            with pytest.raises(NotImplementedError, match="rejoin"):
                buf.low_latency_update_mask_buffer(VICTIM, mask=False)
            with pytest.raises(NotImplementedError, match="rejoin"):
                buf.low_latency_clean_mask_buffer()
            with pytest.raises(ubep.InvalidArgument, match=f"rank {me} cannot mask itself"):
                buf.low_latency_update_mask_buffer(me, mask=True)
            assert call(buf, me, 1) == [0, 0, 1]
        else:
            buf.rejoin()  # ubep-only: on every window of the deep_ep.Buffer
        sync.wait()
        views = []
        # Bounded in time, not in calls (as the test above): the survivors go on masked until a
        # dispatch of their own sees the victim's rejoin, which its first dispatch after
        # rejoin() publishes; on a loaded machine its thread may start that late (a CI run of
        # f908b3f: 8 masked calls, then the assert).
        deadline = time.monotonic() + 10
        for i in range(100000):
            views.append(call(buf, me, 2 + i))
            if views[-1] == [0, 0, 0] or time.monotonic() > deadline:
                break
        assert views[-1] == [0, 0, 0], views[-8:]
        buf.low_latency_clean_mask_buffer()  # back to no rank masked: a no-op again
        return True

    assert ubep.run_on_threads(R, body, timeout=30) == [True] * R
