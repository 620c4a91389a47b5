"""Every bad input gets ubep.InvalidArgument naming the value (never a crash), and the buffer
stays usable: a correct call afterwards matches the reference."""
import ctypes
import threading
import time

import numpy as np
import pytest
import torch

import reference as ref
import ubep

H, E, T, K = 16, 4, 4, 2


def test_error_classes():
    assert issubclass(ubep.InvalidArgument, ubep.Error)
    assert issubclass(ubep.InvalidArgument, ValueError)
    assert issubclass(ubep.TimeoutError, ubep.Error)
    assert issubclass(ubep.TimeoutError, TimeoutError)
    assert not issubclass(ubep.Error, ValueError)


def good_inputs():
    x = torch.randn(3, H).to(torch.bfloat16)
    idx = torch.tensor([[0, 1], [2, -1], [3, 0]])
    w = torch.rand(3, K)
    return x, idx, w


class FakeDevice:
    """An array on another device: a hand-made DLPack capsule (no CUDA needed)."""

    class _DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                    ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                    ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                    ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

    class _Managed(ctypes.Structure):
        pass

    _Managed._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                         ("deleter", ctypes.c_void_p)]

    def __init__(self, device_type=2, device_id=1):
        self._shape = (ctypes.c_int64 * 2)(3, H)
        self._data = (ctypes.c_uint16 * (3 * H))()
        self._m = self._Managed()
        t = self._m.dl_tensor
        t.data = ctypes.addressof(self._data)
        t.device_type, t.device_id, t.ndim = device_type, device_id, 2
        t.code, t.bits, t.lanes = 4, 16, 1  # bfloat16
        t.shape = self._shape

    def __dlpack__(self, stream=None):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self._m), b"dltensor", None)


def bad_dispatch_cases():
    x, idx, w = good_inputs()
    xf = torch.randn(3, H)
    return [
        ("x float64", dict(x=xf.double()), "dispatch: x must be bfloat16", "float64"),
        ("x float32 on a bf16 buffer", dict(x=xf), "dispatch: x must be bfloat16", "float32"),
        ("x float16", dict(x=xf.half()), "dispatch: x must be bfloat16", "float16"),
        ("x not contiguous", dict(x=torch.randn(H, 3).to(torch.bfloat16).t()), "contiguous",
         "strides [1, 3]"),
        ("x on another device", dict(x=FakeDevice()), "is on cuda:1", "the buffer on cpu"),
        ("x 1-d", dict(x=x.reshape(-1)), "x must be [num_tokens, hidden]", "[48]"),
        ("x 4-d", dict(x=x.reshape(1, 1, 3, H)), "1 to 3 dimensions", "4"),
        ("x wrong hidden", dict(x=torch.zeros(3, H + 1, dtype=torch.bfloat16)),
         "hidden size 17", "hidden 16"),
        ("x a list", dict(x=[[1.0] * H] * 3), "__dlpack__", "list"),
        ("too many tokens", dict(x=torch.zeros(T + 1, H, dtype=torch.bfloat16),
                                 idx=torch.zeros(T + 1, K, dtype=torch.long),
                                 w=torch.ones(T + 1, K)), "num_tokens 5", "max_tokens_per_rank=4"),
        ("idx int32", dict(idx=idx.int()), "topk_idx must be int64", "int32"),
        ("idx rows", dict(idx=idx[:2].contiguous()), "topk_idx has 2 rows", "3 tokens"),
        ("expert id too large", dict(idx=torch.tensor([[0, 1], [4, -1], [3, 0]])),
         "expert id 4", "num_experts=4"),
        ("expert id -2", dict(idx=torch.tensor([[0, 1], [-2, -1], [3, 0]])), "expert id -2",
         "[-1"),
        ("duplicate id", dict(idx=torch.tensor([[1, 1], [2, -1], [3, 0]])), "appears twice",
         "token 0"),
        ("topk too large", dict(idx=torch.zeros(3, K + 1, dtype=torch.long) - 1,
                                w=torch.ones(3, K + 1)), "topk 3", "max_topk=2"),
        ("weights float64", dict(w=w.double()), "topk_weights must be float32", "float64"),
        ("weights shape", dict(w=torch.ones(3, K + 1)), "topk_weights shape", "[3, 3]"),
    ]


def _rank_check(g):
    buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
    messages = {}
    for name, change, *needles in bad_dispatch_cases():
        x, idx, w = good_inputs()
        args = dict(x=x, idx=idx, w=w)
        args.update(change)
        for layout in ("throughput", "latency"):
            with pytest.raises(ubep.InvalidArgument) as e:
                buf.dispatch(args["x"], args["idx"], args["w"], layout=layout)
            messages[(name, layout)] = (str(e.value), needles)
    # Still usable: a correct call, checked against the reference.
    spec = ref.Spec(ranks=1, tokens=T, hidden=H, experts=E, topk=K, dtype="bf16")
    x, idx, w = ref.make_inputs(spec, 0, 0)
    tx = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    recv_count = buf.dispatch(tx, torch.from_numpy(idx), torch.from_numpy(w),
                              layout="latency").recv_count
    disp, _ = ref.dispatch_latency(spec, [x], [idx])
    assert recv_count.tolist() == disp[0]["recv_count"].tolist()
    return messages


def test_bad_dispatch_inputs_named_and_buffer_usable():
    messages = ubep.run_on_threads(1, _rank_check, timeout=10)[0]
    for (name, layout), (msg, needles) in messages.items():
        for needle in needles:
            assert needle in msg, f"{name} ({layout}): {needle!r} not in {msg!r}"


def _combine_errors(g):
    buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
    x, idx, w = good_inputs()
    errors = []

    def expect(needle, fn):
        with pytest.raises(ubep.InvalidArgument) as e:
            fn()
        assert needle in str(e.value), (needle, str(e.value))
        errors.append(str(e.value))

    r = buf.dispatch(x, idx, w, layout="latency")
    recv_x, h = r.recv_x, r.handle
    expect("combine: x must be [4, 4, 16]", lambda: buf.combine(recv_x[:, :2].contiguous(), h))
    expect("combine: x must be bfloat16", lambda: buf.combine(recv_x.float(), h))
    expect("topk_weights must be fp32 [3, 2]", lambda: buf.combine(recv_x, h, torch.ones(2, K)))
    expect("combine: out", lambda: buf.combine(recv_x, h, out=torch.empty(2, H,
                                                                          dtype=torch.bfloat16)))
    expect("layout must be 'throughput' or 'latency', got 'low'",
           lambda: buf.dispatch(x, idx, w, layout="low"))
    expect("handle must be the DispatchResult.handle", lambda: buf.combine(recv_x, r))
    expect("no dispatch_send outstanding", lambda: buf.wait_recv_range(0))
    buf.combine(recv_x, h)  # the good one still works
    buf.dispatch(x, idx, w, layout="latency")
    expect("does not belong to the last dispatch", lambda: buf.combine(recv_x, h))
    expect("is not the last dispatch", lambda: r.recv_src)
    other = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
    oh = other.dispatch(x, idx, w, layout="latency").handle
    expect("belongs to another Buffer", lambda: buf.combine(recv_x, oh))
    other.combine(recv_x, oh)
    # Throughput layout: wrong row count.
    t = buf.dispatch(x, idx, w)
    expect("one row per received row", lambda: buf.combine(t.recv_x[:1].contiguous(), t.handle))
    buf.combine(t.recv_x, t.handle)
    return errors


def test_bad_combine_inputs():
    assert len(ubep.run_on_threads(1, _combine_errors, timeout=10)[0]) == 11


@pytest.mark.parametrize("kwargs,needle", [
    (dict(num_experts=3), "num_experts 3"),
    (dict(dtype="fp16"), "fp16"),
    (dict(dtype=torch.float64), "float64"),
    (dict(algorithm="fast"), "unknown algorithm 'fast'"),
    (dict(max_topk=0), "max_topk must be in [1, 64], got 0"),
])
def test_bad_buffer_config(kwargs, needle):
    args = dict(hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
    args.update(kwargs)

    def make(g):
        with pytest.raises(ubep.InvalidArgument) as e:
            ubep.Buffer(g, **args)
        return str(e.value)

    msg = ubep.run_on_threads(2, make, timeout=10)[0]
    assert needle in msg


def test_bad_groups():
    with pytest.raises(ubep.InvalidArgument, match="got builtins.object"):
        ubep.Buffer(object(), hidden=H, num_experts=E)
    with pytest.raises(ubep.InvalidArgument, match="must be >= 1"):
        ubep.run_on_threads(0, lambda g: None)


def test_peer_that_never_comes_times_out():
    """Rank 1 never dispatches (and keeps its Buffer: a hung peer): rank 0 gets
    ubep.TimeoutError naming what it waited for."""
    done = threading.Event()

    def fn(g):
        buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
        if g.rank == 0:
            x, idx, w = good_inputs()
            t0 = time.monotonic()
            try:
                with pytest.raises(ubep.TimeoutError, match="rank 1"):
                    buf.dispatch(x, idx, layout="latency")
            finally:
                done.set()
            return time.monotonic() - t0
        done.wait(20)
        del buf
        return None

    elapsed = ubep.run_on_threads(2, fn, timeout=1.0)[0]
    assert 0.9 < elapsed < 10


def test_peer_that_leaves_fails_the_call_at_once():
    """Rank 1 drops its Buffer instead of dispatching: its departure is published, so rank 0's
    dispatch fails at once (well before the 20 s timeout) naming rank 1."""
    left = threading.Event()

    def fn(g):
        buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
        if g.rank == 1:
            del buf
            left.set()
            return None
        left.wait(20)
        x, idx, w = good_inputs()
        t0 = time.monotonic()
        with pytest.raises(ubep.Error, match="rank 1 failed call 1"):
            buf.dispatch(x, idx, layout="latency")
        return time.monotonic() - t0

    elapsed = ubep.run_on_threads(2, fn, timeout=20.0)[0]
    assert elapsed < 5


def test_numpy_inputs_checked_too():
    def fn(g):
        buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K,
                          dtype="fp32")
        idx = np.array([[0, 1], [2, -1]])
        ro = np.zeros((2, H), dtype=np.float32)
        ro.flags.writeable = False  # NumPy refuses to export read-only arrays through DLPack
        cases = [(ro, "could not be exported through DLPack"),
                 (np.zeros((2, H)), "must be float32, got float64"),
                 (np.zeros((H, 2), dtype=np.float32).T, "must be contiguous"),
                 (np.zeros((2, H), dtype=np.uint16), "must be float32, got uint16")]
        for x, needle in cases:
            with pytest.raises(ubep.InvalidArgument, match=needle):
                buf.dispatch(x, idx, layout="latency")
        y = buf.dispatch(np.ones((2, H), dtype=np.float32), idx, layout="latency")
        return y.recv_count.tolist()

    assert ubep.run_on_threads(1, fn, timeout=10)[0] == [1, 1, 1, 0]
