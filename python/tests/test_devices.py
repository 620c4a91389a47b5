"""Devices without a GPU: device names, the device checks on arrays (a hand-made kDLCUDA
capsule stands for a CUDA tensor: ubep reads only its DLPack header before refusing it), and
the data path of the CUDA backend through the simulation device ("cuda-sim": the CUDA kernels
on CPU threads, host arrays), bit for bit against the NumPy reference and a CPU buffer.
The same checks on a real GPU: test_gpu.py (skipped here)."""
import numpy as np
import pytest
import torch

import reference as ref
import ubep
import ubep.deep_ep as deep_ep
import worker
from test_errors import FakeDevice
from ubep import _arrays, _ubep

# Small: the simulation runs a CPU thread per simulated GPU thread.
SPEC = dict(ranks=2, tokens=5, hidden=32, experts=4, topk=2)


def test_device_names():
    name = _arrays.device_name
    assert name(None) == name("cpu") == name(torch.device("cpu")) == "cpu"
    assert name("cuda:1") == name(torch.device("cuda", 1)) == "cuda:1"
    assert name("cuda-sim") == "cuda-sim:0" and name("cuda-sim:2") == "cuda-sim:2"
    if not torch.cuda.is_available():
        assert name("cuda") == name(torch.device("cuda")) == "cuda:0"
    for bad in ("gpu", "cpu:1", "cuda:x", "cuda-sim:", ""):
        with pytest.raises(ubep.InvalidArgument, match="is not one of|must be a number"):
            name(bad)
    with pytest.raises(ubep.InvalidArgument, match="meta"):
        name(torch.device("meta"))
    with pytest.raises(ubep.InvalidArgument, match="int"):
        name(0)


def test_arrays_are_tagged_with_their_device():
    """What the Buffer's checks see: a host array is cpu, or cuda-sim for a cuda-sim buffer
    (documented: the simulation device's memory is host memory); a kDLCUDA array is
    cuda:<device_id>; a mismatch names both devices."""
    x = torch.zeros(3, 4)
    assert _ubep._borrow_info(x, "fp32")[1] == "fp32[3, 4]"
    addr, desc = _ubep._borrow_info(x, "fp32", "cuda-sim")
    assert addr == x.data_ptr() and desc == "fp32[3, 4] on cuda-sim:0"
    assert _ubep._borrow_info(x.numpy(), "fp32", "cuda-sim:1")[1] == "fp32[3, 4] on cuda-sim:1"
    gpu = FakeDevice(device_type=2, device_id=1)  # kDLCUDA, bf16 [3, 16]
    assert _ubep._borrow_info(gpu, "bf16", "cuda:1")[1] == "bf16[3, 16] on cuda:1"
    cases = [(x, "fp32", "cuda:0", ["is on cpu", "the buffer on cuda:0", '.to("cuda:0")']),
             (gpu, "bf16", "cpu", ["is on cuda:1", "the buffer on cpu", ".cpu()"]),
             (gpu, "bf16", "cuda:0", ["is on cuda:1", "the buffer on cuda:0"]),
             (gpu, "bf16", "cuda-sim", ["is on cuda:1", "the buffer on cuda-sim:0"]),
             (FakeDevice(device_type=10, device_id=0), "bf16", "cpu",
              ["rocm:0", "the buffer on cpu"])]
    for arr, dtype, device, needles in cases:
        with pytest.raises(ubep.InvalidArgument) as e:
            _ubep._borrow_info(arr, dtype, device)
        for needle in needles:
            assert needle in str(e.value), (device, needle, str(e.value))


def test_cuda_tensor_to_cpu_and_sim_buffers_refused():
    """A CUDA array given to a cpu or cuda-sim Buffer: InvalidArgument naming both devices, and
    the buffer stays usable."""
    def body(g):
        out = {}
        for device in ("cpu", "cuda-sim"):
            buf = ubep.Buffer(g, hidden=16, num_experts=2, max_tokens_per_rank=4, max_topk=2,
                              dtype="bf16", device=device)
            assert buf.device == ("cpu" if device == "cpu" else "cuda-sim:0")
            assert buf.config()["device"] == buf.device
            idx = torch.tensor([[0, 1], [1, -1], [0, -1]])
            w = torch.ones(3, 2)
            with pytest.raises(ubep.InvalidArgument) as e:
                buf.dispatch(FakeDevice(device_id=0), idx, w, layout="latency")
            out[device] = str(e.value)
            x = torch.ones(3, 16, dtype=torch.bfloat16)
            r = buf.dispatch(x, idx, w, layout="latency")
            recv_x, count = r.recv_x, r.recv_count
            assert count.tolist() == [2, 2] and recv_x.device.type == "cpu"
        return out

    msgs = ubep.run_on_threads(1, body, timeout=30)[0]
    assert "dispatch: x: the array is on cuda:0, the buffer on cpu" in msgs["cpu"]
    assert "the array is on cuda:0, the buffer on cuda-sim:0" in msgs["cuda-sim"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_buffer_without_a_gpu_says_why():
    def body(g):
        with pytest.raises(ubep.Error) as e:
            ubep.Buffer(g, hidden=16, num_experts=2, max_tokens_per_rank=4, max_topk=2,
                        device="cuda")
        return str(e.value)

    msg = ubep.run_on_threads(1, body, timeout=30)[0]
    assert "cuda" in msg, msg


def _cpu_and_sim(spec, layout, algorithm, framework):
    """The same calls on a cuda-sim and a cpu buffer, thread ranks."""
    sim = ubep.run_on_threads(spec.R, lambda g: worker.run_rank(
        g, spec, layout, algorithm, framework, device="cuda-sim"), timeout=60)
    cpu = ubep.run_on_threads(spec.R, lambda g: worker.run_rank(
        g, spec, layout, algorithm, framework), timeout=60)
    return sim, cpu


def _same(a, b, layout, spec, placement="compact"):
    """Bitwise equality of two runs' results (latency recv_x/recv_src: the valid rows). Not the
    barrier counts: the backends' bsp stages differ."""
    want = worker.expected(spec, layout, placement)
    for it in range(worker.ITERS):
        for r in range(spec.R):
            for key, va in a[r][it].items():
                if key == "barriers":
                    continue
                vb = b[r][it][key]
                if layout == "latency" and key in ("recv_x", "recv_src"):
                    v = want[it][r]["valid"]
                    va, vb = va[v], vb[v]
                assert va.dtype == vb.dtype, key
                np.testing.assert_array_equal(va, vb, err_msg=f"{key} it {it} rank {r}")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("layout", ["throughput", "latency"])
def test_cuda_sim_matches_reference_and_cpu(layout, algorithm, dtype):
    spec = ref.Spec(dtype=dtype, seed=11, **SPEC)
    sim, cpu = _cpu_and_sim(spec, layout, algorithm, "torch")
    worker.check(spec, layout, sim)
    _same(sim, cpu, layout, spec)
    for rank_results in sim:
        for it in rank_results:
            assert (it["barriers"] == 0) == (algorithm == "ubep")


def test_cuda_sim_numpy_three_ranks_per_source_and_hooks():
    """NumPy arrays in and out, 3 ranks, per-source placement, the split phase."""
    spec = ref.Spec(ranks=3, tokens=4, hidden=32, experts=6, topk=2, dtype="bf16", seed=12)
    got = ubep.run_on_threads(3, lambda g: worker.run_rank(
        g, spec, "latency", "ubep", "numpy", hook=True, placement="per-source",
        device="cuda-sim"), timeout=60)
    worker.check(spec, "latency", got, placement="per-source")


def test_cuda_sim_results_are_host_views():
    """A cuda-sim buffer's results: CPU tensors (NumPy arrays for NumPy inputs) viewing the
    simulation device's host memory, exported as kDLCPU, that keep the Buffer alive."""
    def body(g):
        buf = ubep.Buffer(g, hidden=32, num_experts=2, max_tokens_per_rank=4, max_topk=2,
                          dtype="fp32", device="cuda-sim")
        x = torch.arange(3 * 32, dtype=torch.float32).reshape(3, 32)
        idx = torch.tensor([[0, 1], [1, -1], [0, -1]])
        r = buf.dispatch(x, idx, torch.ones(3, 2), layout="latency")
        recv_x, h = r.recv_x, r.handle
        assert recv_x.device == torch.device("cpu") and recv_x.shape == (2, 4, 32)
        assert torch.equal(recv_x[0, :2], x[:3:2]) and torch.equal(recv_x[1, :2], x[:2])
        cb = buf.combine_buffer(h)
        # The same memory as a bare DLPack object (the native layer's export, as for inputs
        # that are neither torch nor NumPy).
        view = buf._window.view("combine_buffer", h.id, _arrays.DLPACK)
        assert type(view).__name__ == "ArrayOut" and view.__dlpack_device__() == (1, 0)
        assert view.device == "cuda-sim:0"
        assert np.asarray(view).ctypes.data == cb.data_ptr()
        cb.copy_(recv_x)
        y = buf.combine(cb, h)
        assert torch.equal(y, x * torch.tensor([[2.0], [1.0], [1.0]]))
        del buf
        return y.sum().item()  # the view keeps the buffer's memory

    assert ubep.run_on_threads(1, body, timeout=30)[0] == pytest.approx(
        float(sum(range(32 * 3)) + sum(range(32))))


def test_cuda_backend_takes_the_weights_at_combine():
    """The CUDA backend (here through cuda-sim) takes topk_weights at combine too
    (DeepEP's way; main's KernelEngine): y = sum_k w[t, k] * rows; weights on another device
    are refused by name."""
    def body(g):
        buf = ubep.Buffer(g, hidden=32, num_experts=2, max_tokens_per_rank=4, max_topk=2,
                          dtype="fp32", device="cuda-sim")
        x = torch.arange(2 * 32, dtype=torch.float32).reshape(2, 32)
        idx = torch.tensor([[0, 1], [1, -1]])
        w = torch.tensor([[0.5, 0.25], [2.0, 0.0]])
        r = buf.dispatch(x, idx, layout="latency")
        cb = buf.combine_buffer(r.handle)
        cb.copy_(r.recv_x)
        y = buf.combine(cb, r.handle, w)
        assert torch.equal(y, x * torch.tensor([[0.75], [2.0]]))
        h = buf.dispatch(x, idx, layout="latency").handle
        with pytest.raises(ubep.InvalidArgument, match="topk_weights"):
            buf.combine(buf.combine_buffer(h), h, FakeDevice(device_type=2, device_id=0))
        return True

    assert ubep.run_on_threads(1, body, timeout=30) == [True]


def test_get_dispatch_layout_torch_path_matches_numpy():
    idx = torch.tensor([[0, 3, -1], [5, 2, 1], [-1, -1, -1], [7, 6, 0]])
    got = deep_ep.get_dispatch_layout(idx, 8, 4)
    want = deep_ep.get_dispatch_layout(idx.numpy(), 8, 4)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
            continue
        assert g.dtype == torch.from_numpy(w).dtype and torch.equal(g, torch.from_numpy(w))


def test_fp8_buffer_on_cpu_and_refused_on_cuda_sim():
    """fp8 (the deepep branch) and devices together: device="cpu" takes fp8 as before; the CUDA
    kernels (cuda, here cuda-sim) have no fp8 dispatch, and the Buffer says so by name."""
    def body(g):
        buf = ubep.Buffer(g, hidden=128, num_experts=2, max_tokens_per_rank=4, max_topk=2,
                          dtype="fp8", device="cpu")
        assert buf.device == "cpu" and buf.config()["dtype"] == "fp8"
        x = torch.ones(3, 128, dtype=torch.bfloat16)
        idx = torch.tensor([[0, 1], [1, -1], [0, -1]])
        r = buf.dispatch(x, idx, layout="latency")  # cast to fp8 on send
        codes, scales, count = r.recv_x, r.recv_x_scales, r.recv_count
        assert count.tolist() == [2, 2] and scales.shape == (2, 4, 1)
        with pytest.raises(ubep.InvalidArgument) as e:
            ubep.Buffer(g, hidden=128, num_experts=2, max_tokens_per_rank=4, max_topk=2,
                        dtype="fp8", device="cuda-sim")
        return str(e.value)

    msg = ubep.run_on_threads(1, body, timeout=30)[0]
    assert "cuda-sim:0" in msg and "fp8" in msg, msg


def _deep_ep_rank(g, device, on="cpu"):
    """ubep.deep_ep, low latency and normal mode, on thread rank g (bf16), tensors on `on`
    (also used by test_gpu.py)."""
    T, H, E, K = 4, 32, 4, 2
    gen = torch.Generator().manual_seed(g.rank + 5)
    x = torch.randn((T, H), generator=gen).to(torch.bfloat16)
    idx = torch.topk(torch.rand((T, E), generator=gen), K, dim=-1).indices
    idx[0, 1] = -1
    w = torch.rand((T, K), generator=gen)
    x, idx, w = x.to(on), idx.to(on), w.to(on)
    buf = deep_ep.Buffer(g, 1 << 22, 1 << 22, low_latency_mode=True, device=device,
                         explicitly_destroy=True)
    out = {}
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False)
    out["ll_count"] = count.clone()
    out["ll_layout"] = handle[1].clone()
    y, _, _ = buf.low_latency_combine(recv, idx, w, handle)
    out["ll_y"] = y.clone()
    cb = buf.get_next_low_latency_combine_buffer(handle)  # a repeated combine, zero copy
    cb.copy_(recv)
    out["ll_y_zero_copy"] = buf.low_latency_combine(cb, idx, w, handle, zero_copy=True)[0].clone()
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    recv_x, recv_idx, recv_w, counts, h, _ = buf.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
    out["n_x"], out["n_idx"], out["n_w"] = recv_x, recv_idx, recv_w
    out["n_counts"] = torch.tensor(counts, device=on)
    # DeepEP's handle: made natively on the cpu, by torch ops for the simulated GPU
    out["n_prefix"], out["n_begins"], out["n_src"], out["n_head"] = h[0], h[2], h[3], h[5]
    assert all(v.device == torch.device(on) for v in out.values())
    cy, cw, _ = buf.combine(recv_x, h, topk_weights=recv_w)
    out["n_y"], out["n_cw"] = cy, cw
    out = {k: v.cpu().clone() for k, v in out.items()}
    # Each rank frees its windows on its own thread (a cuda-sim buffer's teardown meets its
    # peers'); no view of them is left.
    del recv, handle, y, cb, recv_x, recv_idx, recv_w, h, cy, cw
    buf.destroy()
    return out


def test_deep_ep_on_cuda_sim_matches_cpu():
    """ubep.deep_ep(device="cuda-sim"): the CUDA kernels under DeepEP's API (weights given at
    combine), the same bits as the default (the inputs' device, cpu)."""
    sim = ubep.run_on_threads(2, lambda g: _deep_ep_rank(g, "cuda-sim"), timeout=60)
    cpu = ubep.run_on_threads(2, lambda g: _deep_ep_rank(g, None), timeout=60)
    for r in range(2):
        for key, a in cpu[r].items():
            b = sim[r][key]
            assert a.dtype == b.dtype and a.shape == b.shape, key
            assert torch.equal(a, b), (key, r)
