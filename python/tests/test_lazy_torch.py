"""``import ubep`` does not import torch (a cold start's second: what a replacement host's ranks
pay before they serve); torch imported later is adopted on first sight, and its tensors then take
the same path and give the same results as NumPy arrays."""
import subprocess
import sys

import pytest

SCRIPT = r"""
import sys
import numpy as np
import ubep
assert "torch" not in sys.modules, "import ubep imported torch"

H, E, T, K = 64, 8, 16, 2
def problem(rank):
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((T, H)).astype(np.float32)
    idx = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int64)
    w = rng.random((T, K)).astype(np.float32)
    return x, idx, w

def run(g, to):
    buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, dtype=to("dtype"))
    x, idx, w = problem(g.rank)
    r = buf.dispatch(to(x), to(idx), to(w), layout="latency", copy=True)
    y = buf.combine(r.recv_x, r.handle)
    return type(r.recv_x).__module__.split(".")[0], np.array(y).copy()

got_np = ubep.run_on_threads(2, lambda g: run(g, lambda a: "fp32" if a == "dtype" else a))
assert "torch" not in sys.modules, "a NumPy call imported torch"
import torch
def to_torch(a):
    return torch.float32 if isinstance(a, str) else torch.from_numpy(a)
got_t = ubep.run_on_threads(2, lambda g: run(g, to_torch))
for (kn, yn), (kt, yt) in zip(got_np, got_t):
    assert kn == "numpy" and kt == "torch", (kn, kt)
    np.testing.assert_array_equal(yn, yt)
    assert np.abs(yn).sum() > 0
print("ok")
"""


def test_import_does_not_load_torch_and_adopts_it_later():
    pytest.importorskip("torch")
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout + p.stderr
