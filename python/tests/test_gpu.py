"""The Python package on a GPU: device="cuda" Buffers with CUDA tensors (the CUDA kernels),
thread ranks on one GPU. The checks of test_devices.py's cuda-sim cases, bit for bit against the
NumPy reference and a CPU buffer, plus what only a GPU shows: results are CUDA tensors on the
buffer's GPU (zero-copy DLPack kDLCUDA views that keep the Buffer alive), real CUDA tensors to a
CPU buffer and CPU tensors to a CUDA buffer are refused naming both devices.

Skipped without a GPU (torch.cuda.is_available() false). Run by scripts/gpu_check.sh."""
import gc
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (torch.cuda.is_available() is false): the GPU checks run in "
                "scripts/gpu_check.sh on a GPU machine; cuda-sim covers the data path here",
                allow_module_level=True)

import reference as ref  # noqa: E402
import ubep  # noqa: E402
import ubep.deep_ep as deep_ep  # noqa: E402
import worker  # noqa: E402
from ubep import _arrays  # noqa: E402

SPEC = dict(ranks=2, tokens=6, hidden=64, experts=8, topk=3)


def _skip_without_cuda_backend():
    def body(g):
        try:
            ubep.Buffer(g, hidden=16, num_experts=2, max_tokens_per_rank=4, max_topk=2,
                        device="cuda:0")
        except ubep.Error as e:
            if "no CUDA backend" in str(e):
                return str(e)
            raise
        return None

    why = ubep.run_on_threads(1, body, timeout=60)[0]
    if why:
        pytest.skip(f"this build of ubep has no CUDA backend: {why}")


@pytest.fixture(scope="module", autouse=True)
def cuda_backend():
    _skip_without_cuda_backend()


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("layout", ["throughput", "latency"])
def test_cuda_matches_reference_and_cpu(layout, algorithm, dtype):
    spec = ref.Spec(dtype=dtype, seed=21, **SPEC)
    gpu = ubep.run_on_threads(spec.R, lambda g: worker.run_rank(
        g, spec, layout, algorithm, "torch", device="cuda:0"), timeout=60)
    worker.check(spec, layout, gpu)
    cpu = ubep.run_on_threads(spec.R, lambda g: worker.run_rank(
        g, spec, layout, algorithm, "torch"), timeout=60)
    want = worker.expected(spec, layout)
    for it in range(worker.ITERS):
        for r in range(spec.R):
            # Barrier counts: bsp's stages differ between the backends (test_devices._same).
            assert (gpu[r][it]["barriers"] == 0) == (algorithm == "ubep")
            for key, a in gpu[r][it].items():
                if key == "barriers":
                    continue
                b = cpu[r][it][key]
                if layout == "latency" and key in ("recv_x", "recv_src"):
                    v = want[it][r]["valid"]
                    a, b = a[v], b[v]
                np.testing.assert_array_equal(a, b, err_msg=f"{key} it {it} rank {r}")


@pytest.mark.parametrize("placement", ["per-source", "compact"])
def test_cuda_three_ranks_hooks(placement):
    spec = ref.Spec(ranks=3, tokens=4, hidden=64, experts=6, topk=2, dtype="bf16", seed=22)
    got = ubep.run_on_threads(3, lambda g: worker.run_rank(
        g, spec, "latency", "ubep", "torch", hook=True, placement=placement,
        device="cuda"), timeout=60)
    worker.check(spec, "latency", got, placement=placement)


def test_results_are_cuda_views_and_devices_are_checked():
    def body(g):
        dev = torch.device("cuda", 0)
        buf = ubep.Buffer(g, hidden=64, num_experts=2, max_tokens_per_rank=4, max_topk=2,
                          dtype="fp32", device=dev)
        assert buf.device == "cuda:0"
        x = torch.arange(3 * 64, dtype=torch.float32, device=dev).reshape(3, 64)
        idx = torch.tensor([[0, 1], [1, -1], [0, -1]], device=dev)
        r = buf.dispatch(x, idx, layout="latency")  # weights: ones made on the GPU
        recv_x, count, h = r.recv_x, r.recv_count, r.handle
        assert recv_x.device == dev and count.device == dev and recv_x.shape == (2, 4, 64)
        assert count.tolist() == [2, 2]
        assert torch.equal(recv_x[0, :2], x[:3:2]) and torch.equal(recv_x[1, :2], x[:2])
        # The combine buffer as a bare DLPack object (the native layer's export).
        view = buf._window.view("combine_buffer", h.id, _arrays.DLPACK)
        assert view.__dlpack_device__() == (2, 0) and view.device == "cuda:0"
        # numpy.asarray(view): test_numpy_refuses_a_gpu_view (it crashed the process once).
        with pytest.raises(BufferError, match="GPU memory"):
            view.__dlpack__(dl_device=(1, 0))
        cb = buf.combine_buffer(h)
        assert cb.device == dev and cb.data_ptr() == torch.from_dlpack(view).data_ptr()
        cb.copy_(recv_x)
        y = buf.combine(cb, h)
        assert y.device == dev
        assert torch.equal(y, x * torch.tensor([[2.0], [1.0], [1.0]], device=dev))
        # Wrong devices, both ways, named; the buffer stays usable.
        msgs = []
        for bad in (dict(x=x.cpu()), dict(idx=idx.cpu()), dict(x=x.cpu(), idx=idx.cpu())):
            with pytest.raises(ubep.InvalidArgument) as e:
                buf.dispatch(bad.get("x", x), bad.get("idx", idx), layout="latency")
            msgs.append(str(e.value))
        with pytest.raises(ubep.InvalidArgument) as e:
            buf.dispatch(x.cpu().numpy(), idx.cpu().numpy(), layout="latency")
        msgs.append(str(e.value))
        cpu_buf = ubep.Buffer(g, hidden=64, num_experts=2, max_tokens_per_rank=4, max_topk=2,
                              dtype="fp32")
        with pytest.raises(ubep.InvalidArgument) as e:
            cpu_buf.dispatch(x, idx.cpu(), layout="latency")
        msgs.append(str(e.value))
        recv_x2 = buf.dispatch(x, idx, layout="latency").recv_x
        assert torch.equal(recv_x2[0, :2], x[:3:2])
        del buf, cpu_buf
        torch.cuda.synchronize()
        return msgs, y.sum().item()  # the view keeps the buffer's GPU memory

    msgs, total = ubep.run_on_threads(1, body, timeout=60)[0]
    assert total == float(sum(range(64 * 3)) + sum(range(64)))
    for m in msgs[:4]:
        assert "is on cpu, the buffer on cuda:0" in m, m
    assert "is on cuda:0, the buffer on cpu" in msgs[4], msgs[4]


def test_get_dispatch_layout_on_the_gpu():
    idx = torch.tensor([[0, 3, -1], [5, 2, 1], [-1, -1, -1], [7, 6, 0]], device="cuda")
    got = deep_ep.get_dispatch_layout(idx, 8, 4)
    want = deep_ep.get_dispatch_layout(idx.cpu().numpy(), 8, 4)
    for g, w in zip(got, want):
        if w is None:
            continue
        assert g.device.type == "cuda"
        assert torch.equal(g.cpu(), torch.from_numpy(w))


def test_deep_ep_on_cuda_tensors_matches_cpu():
    """ubep.deep_ep with CUDA tensors: its windows on the tensors' GPU (device=None), results
    on the GPU, the same bits as on CPU tensors."""
    from test_devices import _deep_ep_rank
    gpu = ubep.run_on_threads(2, lambda g: _deep_ep_rank(g, None, on="cuda:0"), timeout=60)
    cpu = ubep.run_on_threads(2, lambda g: _deep_ep_rank(g, None), timeout=60)
    for r in range(2):
        for key, a in cpu[r].items():
            assert torch.equal(a, gpu[r][key]), (key, r)


def test_buffers_freed_after_their_threads_on_one_thread():
    """Buffers that outlive their rank threads (held by a result here) are freed one after
    another on this thread, as the garbage collector frees them: no tear-down waits for a peer
    (it would wait out the group's timeout), and the results stay readable until then."""
    timeout = 20.0

    def body(g):
        dev = torch.device("cuda", 0)
        buf = ubep.Buffer(g, hidden=64, num_experts=4, max_tokens_per_rank=4, max_topk=2,
                          dtype="fp32", device=dev)
        x = torch.full((2, 64), float(g.rank + 1), device=dev)
        idx = torch.tensor([[0, 3], [1, 2]], device=dev)  # experts 0, 1 on rank 0; 2, 3 on 1
        return buf, buf.dispatch(x, idx, layout="throughput")

    kept = ubep.run_on_threads(2, body, timeout=timeout)
    for me, (_, r) in enumerate(kept):
        # Every token has an expert on each rank: each rank gets all 4 rows, by source rank.
        assert r.recv_x[:, 0].tolist() == [1.0, 1.0, 2.0, 2.0], me
    t0 = time.monotonic()
    del kept, r
    gc.collect()
    torch.cuda.synchronize()
    took = time.monotonic() - t0
    assert took < timeout / 2, f"freeing the Buffers took {took:.1f} s: a tear-down waited"


def test_numpy_refuses_a_gpu_view():
    """numpy.asarray on a view of GPU memory raises an error naming GPU memory. In a child
    process: on the H200 machine (NumPy 2.5.2, 2026-12-04) this call crashed the interpreter
    (SIGSEGV), which here is a failure with its output instead of the end of the suite."""
    code = textwrap.dedent("""
        import numpy as np, torch, ubep
        from ubep import _arrays
        def body(g):
            buf = ubep.Buffer(g, hidden=64, num_experts=2, max_tokens_per_rank=4, max_topk=2,
                              dtype="fp32", device="cuda:0")
            x = torch.ones(3, 64, device="cuda")
            idx = torch.tensor([[0, 1], [1, -1], [0, -1]], device="cuda")
            r = buf.dispatch(x, idx, layout="latency")
            view = buf._window.view("combine_buffer", r.handle.id, _arrays.DLPACK)
            try:
                np.asarray(view)
            except (ubep.InvalidArgument, BufferError) as e:
                return "refused: " + str(e)
            return "no error"
        print(ubep.run_on_threads(1, body, timeout=60)[0])
    """)
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    assert "refused: " in p.stdout and "GPU memory" in p.stdout, p.stdout
