"""Zero copy both ways, the documented lifetime of result views, copy=True, Ctrl-C."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import ubep
from ubep import _ubep

H, E, T, K = 32, 4, 4, 2


def make_x(fill):
    return torch.full((T, H), float(fill), dtype=torch.bfloat16)


IDX = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]])
W = torch.ones(T, K)


def test_inputs_are_read_in_place():
    x = torch.randn(T, H).to(torch.bfloat16)
    addr, desc = _ubep._borrow_info(x, "bf16")
    assert addr == x.data_ptr() and desc == "bf16[4, 32]"
    sliced = torch.randn(8, H)[2:6]  # a view with an offset: still no copy
    assert _ubep._borrow_info(sliced, "fp32")[0] == sliced.data_ptr()
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert _ubep._borrow_info(a, "int64")[0] == a.ctypes.data
    bits = np.zeros((2, 3), dtype=np.uint16)  # NumPy bf16 = uint16 bit patterns
    assert _ubep._borrow_info(bits, "bf16")[1] == "bf16[2, 3]"
    # A tensor that requires grad is read through detach(): same memory.
    p = torch.nn.Parameter(torch.randn(T, H))
    assert _ubep._borrow_info(p, "fp32")[0] == p.data_ptr()


def _views(g):
    buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
    seen = []
    for call in range(4):
        r = buf.dispatch(make_x(call + 1), IDX, W, layout="latency")
        recv_x = r.recv_x
        seen.append((recv_x, recv_x.clone(), r.recv_count.clone()))
        cb = buf.combine_buffer(r.handle)
        cb.copy_(recv_x)
        y = buf.combine(cb, r.handle)
        seen[-1] += (y, y.clone())
    return buf, seen


def test_results_are_views_with_documented_lifetime():
    buf, seen = ubep.run_on_threads(1, _views, timeout=10)[0]
    # Results view ubep's memory: the double-buffered window gives calls N and N+2 the same
    # recv_x memory, so an old view shows the newer data; the clone taken at the time kept it.
    assert seen[0][0].data_ptr() == seen[2][0].data_ptr() != seen[1][0].data_ptr()
    assert torch.equal(seen[0][0][0, 0], torch.full((H,), 3.0, dtype=torch.bfloat16))
    assert torch.equal(seen[0][1][0, 0], torch.full((H,), 1.0, dtype=torch.bfloat16))
    # Combine results: one output, reused by every combine (valid until the next combine).
    assert seen[0][3].data_ptr() == seen[3][3].data_ptr()
    assert torch.equal(seen[3][3], seen[3][4]) and not torch.equal(seen[0][3], seen[0][4])
    # A view keeps the Buffer's memory mapped after the Buffer and group are gone.
    old = seen[3][0]
    del buf, seen
    gc.collect()
    assert float(old[0, 0, 0]) == 4.0


def _copies(g):
    buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
    a = buf.dispatch(make_x(1), IDX, W, layout="latency", copy=True)
    ya = buf.combine(a.recv_x, a.handle, copy=True)
    b = buf.dispatch(make_x(2), IDX, W, layout="latency")
    buf.combine(b.recv_x, b.handle)
    c = buf.dispatch(make_x(5), IDX, W, layout="latency")
    yc = buf.combine(c.recv_x, c.handle)
    tp = buf.dispatch(make_x(7), IDX, W, copy=True)
    buf.combine(tp.recv_x, tp.handle)
    buf.dispatch(make_x(8), IDX, W)
    return (a.recv_x, a.recv_count), ya, yc, tp.recv_x


def test_copy_true_survives_later_calls():
    a, ya, yc, tp = ubep.run_on_threads(1, _copies, timeout=10)[0]
    assert torch.equal(a[0][0, 0], torch.full((H,), 1.0, dtype=torch.bfloat16))
    assert a[1].tolist() == [2, 2, 2, 2]
    assert torch.equal(ya, torch.full((T, H), 2.0, dtype=torch.bfloat16))  # 1*1 + 1*1
    # yc was a view (no copy): the later throughput combine (x = 7, one rank) overwrote it.
    assert torch.equal(yc, torch.full((T, H), 7.0, dtype=torch.bfloat16))
    assert torch.equal(tp, torch.full((T, H), 7.0, dtype=torch.bfloat16))


def test_out_argument_and_weights_at_combine():
    def fn(g):
        buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
        stats = torch.zeros(E, dtype=torch.int32)
        out = torch.empty(T, H, dtype=torch.bfloat16)
        for _ in range(2):
            r = buf.dispatch(make_x(3), IDX, layout="latency")
            stats += r.recv_count.to(torch.int32)
            y = buf.combine(r.recv_x, r.handle, W * 0.5, out=out)
            assert y is out
        return stats, out

    stats, out = ubep.run_on_threads(1, fn, timeout=10)[0]
    assert stats.tolist() == [4, 4, 4, 4]
    assert torch.equal(out, torch.full((T, H), 3.0, dtype=torch.bfloat16))  # 0.5*3 + 0.5*3


def test_interrupt_flag_ends_a_wait_on_a_rank_thread():
    """What Ctrl-C does to thread ranks (the flag our SIGINT handler sets): the waiting rank
    stops with ubep.Error long before its 30 s timeout."""
    done = threading.Event()

    def fn(g):
        buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=K)
        if g.rank == 1:
            done.wait(30)  # never dispatches; keeps its Buffer (dropping it would end the wait)
            return None
        threading.Timer(0.5, _ubep._raise_interrupt_flag).start()
        t0 = time.monotonic()
        try:
            with pytest.raises(ubep.Error, match="interrupted while waiting"):
                buf.dispatch(make_x(1), IDX, layout="latency")
        finally:
            done.set()
        return time.monotonic() - t0

    elapsed = ubep.run_on_threads(2, fn, timeout=30)[0]
    _ubep._clear_interrupt()
    assert elapsed < 10


SIGINT_SCRIPT = textwrap.dedent("""
    import sys, threading, time, torch, ubep
    from ubep import _ubep
    world = _ubep.ThreadWorld(2, 60.0, 0)
    g0, g1 = world.group(0), world.group(1)
    mk = lambda g: ubep.Buffer(g, hidden=8, num_experts=2, max_tokens_per_rank=1, max_topk=1)
    bufs = {}
    t = threading.Thread(target=lambda: bufs.setdefault(1, mk(g1)))
    t.start(); b0 = mk(g0); t.join()
    x, idx = torch.zeros(1, 8, dtype=torch.bfloat16), torch.zeros(1, 1, dtype=torch.long)
    print("waiting", flush=True)
    try:
        b0.dispatch(x, idx, layout="latency")   # rank 1 never comes: only Ctrl-C ends this
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        sys.exit(3)
""")


def test_ctrl_c_interrupts_a_wait_in_the_main_thread():
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-c", SIGINT_SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "waiting"
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, (out, err)
    assert "KeyboardInterrupt" in out
    assert time.monotonic() - t0 < 10


class Foreign:
    """An array from a framework ubep does not know: only the DLPack protocol."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_other_frameworks_get_dlpack_objects():
    """Inputs that are neither torch nor NumPy come back as ubep.ArrayOut, which both
    torch.utils.dlpack.from_dlpack and numpy.from_dlpack (fp32) take without a copy."""
    def fn(g):
        buf = ubep.Buffer(g, hidden=8, num_experts=2, max_tokens_per_rank=2, max_topk=1,
                          dtype="fp32")
        x = np.arange(16, dtype=np.float32).reshape(2, 8)
        idx = np.array([[1], [0]], dtype=np.int64)
        recv_x = buf.dispatch(Foreign(x), idx, layout="latency").recv_x
        assert type(recv_x).__name__ == "ArrayOut" and recv_x.shape == (2, 2, 8)
        t = torch.utils.dlpack.from_dlpack(recv_x)
        n = np.from_dlpack(recv_x)
        assert t.data_ptr() == n.ctypes.data  # both view the same ubep memory
        assert t[0, 0].tolist() == x[1].tolist() and n[1, 0].tolist() == x[0].tolist()
        return True

    assert ubep.run_on_threads(1, fn, timeout=10)[0]
