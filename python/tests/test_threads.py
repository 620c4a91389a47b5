"""Thread ranks: every layout, algorithm, framework and dtype, bit-identical to the NumPy
reference over several calls."""
import numpy as np
import pytest

import reference as ref
import ubep
import worker


@pytest.mark.parametrize("framework", ["torch", "numpy"])
@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("layout", ["throughput", "latency"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_matches_reference(layout, algorithm, framework, dtype):
    spec = ref.Spec(ranks=2, dtype=dtype)
    got = ubep.run_on_threads(
        2, lambda g: worker.run_rank(g, spec, layout, algorithm, framework), timeout=30)
    worker.check(spec, layout, got)
    for rank_results in got:
        for it in rank_results:
            if algorithm == "ubep":
                assert it["barriers"] == 0
            else:
                assert it["barriers"] > 0


@pytest.mark.parametrize("ranks", [3, 4])
def test_more_ranks(ranks):
    spec = ref.Spec(ranks=ranks, experts=12 if ranks == 3 else 8, topk=4, dtype="bf16", seed=5)
    for layout in ("throughput", "latency"):
        got = ubep.run_on_threads(
            ranks, lambda g: worker.run_rank(g, spec, layout, "ubep", "torch"), timeout=30)
        worker.check(spec, layout, got)


@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("layout", ["throughput", "latency"])
def test_two_hosts_over_the_relay(algorithm, layout):
    """4 thread ranks as 2 hosts of 2: traffic between them takes the cross-host relay, and
    combine adds per-host partials (the reference models that order)."""
    spec = ref.Spec(ranks=4, experts=8, topk=3, dtype="fp32", seed=8, ranks_per_host=2)
    got = ubep.run_on_threads(
        4, lambda g: worker.run_rank(g, spec, layout, algorithm, "torch"), timeout=30,
        ranks_per_host=2)
    worker.check(spec, layout, got)


@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("framework", ["torch", "numpy"])
def test_per_source_placement(algorithm, framework):
    """placement="per-source" (ubep's default for the latency layout under "auto")."""
    spec = ref.Spec(ranks=3, experts=6, topk=2, dtype="bf16", seed=6)
    got = ubep.run_on_threads(3, lambda g: worker.run_rank(
        g, spec, "latency", algorithm, framework, placement="per-source"), timeout=30)
    worker.check(spec, "latency", got, placement="per-source")


@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("framework", ["torch", "numpy"])
def test_split_phase_hooks(algorithm, framework):
    """dispatch_send/dispatch_recv and combine_send/combine_recv (the ubep algorithm's split
    phase; bsp runs whole calls): recv_x/recv_count/y are filled once the *_recv return."""
    spec = ref.Spec(ranks=2, dtype="bf16", seed=3)
    got = ubep.run_on_threads(
        2, lambda g: worker.run_rank(g, spec, "latency", algorithm, framework, hook=True),
        timeout=30)
    worker.check(spec, "latency", got)


@pytest.mark.parametrize("framework", ["torch", "numpy"])
def test_weights_given_to_combine_and_copy_input(framework):
    """The weights given to combine, not to dispatch (latency layout); and a combine input
    outside the zero-copy buffer."""
    spec = ref.Spec(ranks=2, dtype="fp32", seed=4)
    got = ubep.run_on_threads(
        2, lambda g: worker.run_rank(g, spec, "latency", "ubep", framework, zero_copy=False,
                                     weights_at_combine=True), timeout=30)
    worker.check(spec, "latency", got)



@pytest.mark.parametrize("placement", ["per-source", "compact"])
def test_receive_hook_per_range(placement):
    """Buffer.wait_recv_range(source, expert) between dispatch_send and dispatch_recv: the rows
    of the range are final when it returns (equal to what the completed call holds), the range
    equals recv_range, the ranges add up to recv_count; a combine before dispatch_recv, or a
    wait out of the split phase, is refused."""
    spec = ref.Spec(ranks=2, dtype="fp32", seed=9)

    def body(g):
        buf = ubep.Buffer(g, hidden=spec.H, num_experts=spec.E, max_tokens_per_rank=spec.T,
                          max_topk=spec.K, dtype=spec.dtype, timeout=30.0, placement=placement)
        x, idx, w = ref.make_inputs(spec, buf.rank, 0)
        pending = buf.dispatch_send(x, idx, w, layout="latency")
        recv_x, recv_count = pending.recv_x, pending.recv_count
        seen = {}
        for e in range(buf.num_local_experts):
            for s in range(buf.num_ranks):
                b, n = buf.wait_recv_range(s, e)
                seen[(e, s)] = (b, n, recv_x[e, b:b + n].copy())
        with pytest.raises(ubep.InvalidArgument, match="split-phase call is still outstanding"):
            buf.combine(recv_x, pending.handle)
        r = buf.dispatch_recv()
        rr = r.recv_range
        for (e, s), (b, n, rows) in seen.items():
            assert (b, n) == (int(rr[e, s, 0]), int(rr[e, s, 1]))
            assert np.array_equal(rows, recv_x[e, b:b + n])
        for e in range(buf.num_local_experts):
            assert sum(seen[(e, s)][1] for s in range(buf.num_ranks)) == int(recv_count[e])
        with pytest.raises(ubep.InvalidArgument, match="no dispatch_send outstanding"):
            buf.wait_recv_range(0, 0)
        return True

    assert ubep.run_on_threads(2, body, timeout=30) == [True, True]


@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("layout", ["throughput", "latency"])
def test_repeated_combine(layout, algorithm):
    """One dispatch combined three times, each bit-identical to the reference: zero-copy from
    the window, then other expert outputs from the caller's memory, then the first outputs
    again zero-copy (after a combine, combine_buffer is an owned array: peers may
    still read the window). Then ordinary calls on the same buffer."""
    spec = ref.Spec(ranks=2, dtype="bf16", seed=11)
    variants = (100, 200, 100)  # make_expert_output's `it` for each combine

    def body(g):
        buf = ubep.Buffer(g, hidden=spec.H, num_experts=spec.E, max_tokens_per_rank=spec.T,
                          max_topk=spec.K, dtype=spec.dtype, algorithm=algorithm, timeout=30.0)
        x, idx, w = ref.make_inputs(spec, buf.rank, 0)
        ys = []
        r = buf.dispatch(x, idx, w, layout=layout)
        recv_x, h = r.recv_x, r.handle
        shape = (recv_x.shape[0], spec.H) if layout == "throughput" else tuple(recv_x.shape)
        window = buf.combine_buffer(h)
        for i, it in enumerate(variants):
            out = ref.make_expert_output(spec, buf.rank, it, shape)
            if i != 1:
                cb = buf.combine_buffer(h)
                assert (cb is window) == (i == 0)
                cb[...] = out
                out = cb
            if layout == "throughput":
                y = buf.combine(out, h)
            elif i == 1:  # into the caller's array (written by the reduction itself)
                mine = np.zeros((x.shape[0], spec.H), dtype=out.dtype)
                y = buf.combine(out, h, out=mine)
                assert y is mine
            else:
                y = buf.combine(out, h)
            ys.append(worker.to_np(y))
        after = worker.run_rank(g, spec, layout, algorithm, "numpy")
        return ys, after

    got = ubep.run_on_threads(2, body, timeout=30)
    xs, idxs, ws = zip(*[ref.make_inputs(spec, r, 0) for r in range(spec.R)])
    for i, it in enumerate(variants):
        if layout == "throughput":
            disp = ref.dispatch_throughput(spec, xs, idxs, ws)
            outs = [ref.make_expert_output(spec, d, it, (disp[d]["recv_x"].shape[0], spec.H))
                    for d in range(spec.R)]
            want = ref.combine_throughput(spec, disp, outs, [x.shape[0] for x in xs])
        else:
            disp, where = ref.dispatch_latency(spec, xs, idxs)
            outs = [ref.make_expert_output(spec, d, it, disp[d]["recv_x"].shape)
                    for d in range(spec.R)]
            want = ref.combine_latency(spec, where, outs, idxs, ws)
        for r in range(spec.R):
            np.testing.assert_array_equal(got[r][0][i], want[r], err_msg=f"combine {i} rank {r}")
    worker.check(spec, layout, [after for _, after in got])
