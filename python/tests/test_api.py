"""DeepEP's extras through ubep.deep_ep (get_dispatch_layout, cached dispatch,
expert_alignment, events, bias), ubep.Buffer's last_stats and algorithm switch, and
python3 -m ubep.bench's JSON."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import reference as ref
import ubep
import ubep.deep_ep as deep_ep


def test_get_dispatch_layout_matches_a_direct_count():
    rng = np.random.default_rng(0)
    idx = rng.integers(-1, 16, size=(50, 4))
    per_rank, rdma, per_expert, in_rank = deep_ep.get_dispatch_layout(idx, 16, 4)
    assert rdma is None
    want_in_rank = np.zeros((50, 4), dtype=bool)
    for t in range(50):
        for e in idx[t]:
            if e >= 0:
                want_in_rank[t, e // 4] = True
    np.testing.assert_array_equal(in_rank, want_in_rank)
    np.testing.assert_array_equal(per_rank, want_in_rank.sum(0))
    np.testing.assert_array_equal(per_expert, [(idx == e).sum() for e in range(16)])
    t_rank, _, t_expert, t_in = deep_ep.get_dispatch_layout(torch.from_numpy(idx), 16, 4)
    assert isinstance(t_rank, torch.Tensor) and t_rank.dtype == torch.int32
    assert t_rank.tolist() == per_rank.tolist() and t_in.numpy().tolist() == in_rank.tolist()
    with pytest.raises(ubep.InvalidArgument, match="expert id 16"):
        deep_ep.get_dispatch_layout(np.array([[16]]), 16, 4)


def _extras(g):
    spec = ref.Spec(ranks=2, dtype="fp32", seed=9)
    buf = deep_ep.Buffer(g, 1 << 30, max_tokens_per_rank=spec.T)
    x, idx, w = (torch.from_numpy(a) for a in ref.make_inputs(spec, g.rank, 0))
    layout = buf.get_dispatch_layout(idx, spec.E, None)
    assert len(layout) == 5 and isinstance(layout[-1], deep_ep.EventOverlap)
    rx, ridx, rw, counts, h, event = buf.dispatch(x, num_tokens_per_rank=layout[0],
                                                  is_token_in_rank=layout[3],
                                                  num_tokens_per_expert=layout[2],
                                                  topk_idx=idx, topk_weights=w,
                                                  expert_alignment=4)
    event.current_stream_wait()
    assert all(c % 4 == 0 for c in counts)
    first = rx.clone()
    y, cw, _ = buf.combine(rx, h, topk_weights=rw)
    # DeepEP's combined_topk_weights: each rank passes back its received weights, summed.
    assert torch.equal(cw, torch.where(idx >= 0, w, torch.zeros_like(w)))
    # Cached dispatch (DeepEP: the handle's layout, new data).
    rx2 = buf.dispatch(x * 2, handle=h)[0]
    assert torch.equal(rx2, first * 2)
    y2, _, _ = buf.combine(rx2, h, bias=torch.ones(1, spec.H))
    assert torch.equal(y2, y * 2 + 1)
    # ubep's own Buffer: the last call's stats and the algorithm switch.
    ub = ubep.Buffer(g, hidden=spec.H, num_experts=spec.E, max_tokens_per_rank=spec.T,
                     max_topk=spec.K, dtype=torch.float32)
    ub.dispatch(x, idx, w)
    stats = ub.last_stats()
    assert stats["barriers"] == 0 and [s for s, _ in stats["stage_us"]]
    ub.algorithm = "bsp"
    ub.dispatch(x, idx, w)
    assert ub.algorithm == "bsp" and ub.last_stats()["barriers"] == 3
    return True


def test_groups():
    def fn(g):
        before = g.barrier_count
        g.barrier()
        return g.rank, g.size, g.kind, g.num_hosts, g.host_of(g.rank), g.barrier_count - before

    assert ubep.run_on_threads(3, fn) == [(r, 3, "threads", 1, 0, 1) for r in range(3)]
    hosts = ubep.run_on_threads(4, lambda g: [g.host_of(r) for r in range(4)], ranks_per_host=2)
    assert hosts[0] == [0, 0, 1, 1]


def test_deepep_extras():
    assert all(ubep.run_on_threads(2, _extras, timeout=30))


def test_bench_json(tmp_path):
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, "-m", "ubep.bench", "--workload", "tiny", "--iters",
                           "5", "--warmup", "1", "--no-ubep-bench", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(out.read_text())
    assert rep["config"]["workload"] == "tiny" and rep["config"]["ranks"] == 2
    impls = {(r["impl"], r["op"]) for r in rep["results"]}
    assert impls == {(i, o) for i in ("ubep", "bsp", "torch") for o in ("dispatch", "combine")}
    for r in rep["results"]:
        assert r["median_us"] > 0 and r["p99_us"] >= r["median_us"] and r["gbps"] > 0
    assert {(b["impl"], b["op"]) for b in rep["binding"]} == {
        (i, o) for i in ("ubep", "bsp") for o in ("dispatch", "combine")}


def test_bench_deep_ep_rows(tmp_path):
    """The DeepEP-API rows: deep_ep (bf16) and deep_ep_fp8 (DeepEP's default use_fp8=True)."""
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, "-m", "ubep.bench", "--workload", "tiny", "--iters",
                           "5", "--warmup", "1", "--no-ubep-bench", "--algo",
                           "ubep,deep_ep,deep_ep_fp8", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(out.read_text())
    got = {(r["impl"], r["op"]): r for r in rep["results"]}
    assert set(got) == {(i, o) for i in ("ubep", "deep_ep", "deep_ep_fp8")
                        for o in ("dispatch", "combine")}
    for r in got.values():
        assert r["median_us"] > 0 and r["gbps"] > 0
    # An fp8 row is about half a bf16 one: the GB/s use each row's own bytes.
    fp8, bf16 = got[("deep_ep_fp8", "dispatch")], got[("ubep", "dispatch")]
    assert 0.45 < fp8["bytes_per_rank"] / bf16["bytes_per_rank"] < 0.6


def test_dlpack_export_refuses_another_device_and_a_copy():
    """__dlpack__ honours DLPack 1.0's dl_device and copy: the buffer's own device exports,
    another device or copy=True gets BufferError naming the view (never a misread pointer)."""
    from ubep import _arrays

    def body(g):
        buf = ubep.Buffer(g, hidden=8, num_experts=2, max_tokens_per_rank=2, max_topk=1,
                          dtype="fp32")
        r = buf.dispatch(np.ones((1, 8), np.float32), np.zeros((1, 1), np.int64),
                         layout="latency")
        view = buf._window.view("combine_buffer", r.handle.id, _arrays.DLPACK)
        assert view.__dlpack_device__() == (1, 0)
        np.testing.assert_array_equal(np.from_dlpack(view).shape, view.shape)
        view.__dlpack__(dl_device=(1, 0))
        with pytest.raises(BufferError, match="cannot be exported to DLPack device"):
            view.__dlpack__(dl_device=(2, 0))
        with pytest.raises(BufferError, match="copy=True"):
            view.__dlpack__(copy=True)
        return True

    assert ubep.run_on_threads(1, body, timeout=30) == [True]
