"""oneCCL's alltoallv as a baseline in ``python -m ubep.bench`` (docs/INTEGRATIONS.md, "oneCCL"):
ubep's C++ all-to-all baseline over ccl::alltoallv beside ubep, bsp, the MPI baseline and torch in
one run, at 2 ranks, its combine output equal to ubep's bit for bit. Needs an extension built with
-DUBEP_ONECCL_ROOT (scripts/test.sh does it with scripts/venv.sh --oneccl); skipped naming that
otherwise. The identity check itself is shown able to fail (on thread ranks, any build)."""
import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import ubep
from ubep import _bench_run, _ubep

MPIRUN = shutil.which("mpirun")
NO_ONECCL = ("this ubep extension was built without oneCCL (cmake -DUBEP_ONECCL_ROOT=<prefix of "
             "oneccl-cpu-devel>; scripts/venv.sh --oneccl makes one)")
needs_oneccl = pytest.mark.skipif(not _ubep.has_oneccl, reason=NO_ONECCL)
# Small token counts keep the run to seconds; decode keeps its latency layout, prefill its
# throughput layout, so both of the baseline's paths are compared with ubep's.
SHAPES = ["--workload", "decode,prefill", "--tokens", "24", "--iters", "3", "--warmup", "1"]


def _run(cmd, out):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    proc = subprocess.run(cmd + SHAPES + ["--json", str(out)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


def _check(rep, impls, baselines):
    got = {(r["workload"], r["impl"], r["op"]) for r in rep["results"]}
    assert got == {(w, i, o) for w in ("decode", "prefill") for i in impls
                   for o in ("dispatch", "combine")}
    for r in rep["results"]:
        assert r["median_us"] > 0 and r["p99_us"] >= r["median_us"], r
    ident = {(e["workload"], e["baseline"]): e for e in rep["identity"]}
    assert set(ident) == {(w, b) for w in ("decode", "prefill") for b in baselines}
    for (w, b), e in ident.items():
        assert e["elements"] == 2 * 24 * 7168, e
        assert e[f"y_vs_{b}"] == 0, e


@needs_oneccl
def test_oneccl_beside_ubep_and_torch_on_local_processes(tmp_path):
    rep, out = _run([sys.executable, "-m", "ubep.bench", "--algo", "ubep,bsp,oneccl,torch",
                     "--no-ubep-bench"], tmp_path / "b.json")
    _check(rep, ("ubep", "bsp", "oneccl", "torch"), ("oneccl",))
    assert "y vs oneccl baseline 0 of" in out


@needs_oneccl
@pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed")
def test_oneccl_beside_mpi_and_torch_under_mpirun(tmp_path):
    pytest.importorskip("mpi4py")
    rep, _ = _run([MPIRUN, "-np", "2", "--bind-to", "none", sys.executable, "-m", "ubep.bench",
                   "--algo", "ubep,mpi,oneccl,torch"], tmp_path / "b.json")
    _check(rep, ("ubep", "mpi", "oneccl", "torch"), ("mpi", "oneccl"))


def test_oneccl_refused_by_name_without_it(monkeypatch):
    monkeypatch.setattr(_ubep, "has_oneccl", False)
    args = types.SimpleNamespace(algo="ubep,oneccl", tokens=None)
    with pytest.raises(SystemExit, match="built without oneCCL.*UBEP_ONECCL_ROOT"):
        _bench_run.check_args(args)
    with pytest.raises(SystemExit, match="unknown nccl"):
        _bench_run.check_args(types.SimpleNamespace(algo="ubep,nccl", tokens=None))
    with pytest.raises(SystemExit, match="--tokens 0"):
        _bench_run.check_args(types.SimpleNamespace(algo="ubep", tokens=0))


class _Corrupted:
    """A baseline whose last y has one bf16 element's lowest bit flipped on rank 0."""

    def __init__(self, base, rank):
        self.base, self.rank = base, rank

    def last_y(self):
        y = np.frombuffer(self.base.last_y(), dtype=np.int16).copy()
        if self.rank == 0:
            y[5] ^= 1
        return y.tobytes()


def _identity_on_threads(g):
    T, H, E = 8, 64, 16
    rng = np.random.default_rng(3 + g.rank)
    idx, w = _bench_run.routing(rng, T, 4, E)
    x = torch.from_numpy(rng.uniform(-1, 1, (T, H)).astype(np.float32)).to(torch.bfloat16)
    idx, w = torch.from_numpy(idx), torch.from_numpy(w)
    buf = ubep.Buffer(g, hidden=H, num_experts=E, max_tokens_per_rank=T, max_topk=4,
                      dtype=torch.bfloat16)
    with pytest.raises(ubep.InvalidArgument, match="exchange 'gloo'"):
        buf.baseline("gloo")
    base = buf.baseline()  # the thread ranks' in-process exchange
    base.time_calls(x, idx, w, False, 1, 0, True)
    ctx = _bench_run.Ctx(g.rank, g.size, g, None, lambda n: n, None, "threads")
    args = (x, idx, w, T, E, False)
    good = _bench_run.identity_check(ctx, buf, base, "mpi", *args)
    bad = _bench_run.identity_check(ctx, buf, _Corrupted(base, g.rank), "mpi", *args)
    return good, bad


def test_identity_check_can_fail():
    """The check the oneCCL rows rest on: 0 differing elements against the real baseline, and
    exactly the one corrupted element where the baseline's y is off by one bit."""
    res = ubep.run_on_threads(2, _identity_on_threads, timeout=60)
    for rank, (good, bad) in enumerate(res):
        assert good == {"elements": 8 * 64, "y_vs_mpi": 0}, good
        assert bad == {"elements": 8 * 64, "y_vs_mpi": 1 if rank == 0 else 0}, bad
