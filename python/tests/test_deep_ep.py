"""ubep.deep_ep in DeepEP's own test pattern (deep_ep_worker.py) on real processes:
torch.multiprocessing.spawn + gloo with 2 and 4 ranks, and mpirun + mpi4py."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "deep_ep_worker.py")
MPIRUN = shutil.which("mpirun")


def _run(cmd, ranks, env=None):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, GLOO_SOCKET_IFNAME="lo", **(env or {})))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": OK (8 low-latency configs, normal mode)") == ranks, proc.stdout


@pytest.mark.parametrize("ranks,algorithm", [(2, "ubep"), (4, "ubep"), (2, "bsp")])
def test_spawn_gloo(ranks, algorithm):
    _run([sys.executable, WORKER, "spawn", str(ranks), algorithm], ranks)


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed")
@pytest.mark.parametrize("ranks,algorithm", [(2, "ubep"), (4, "bsp")])
def test_mpirun(ranks, algorithm):
    pytest.importorskip("mpi4py")
    _run([MPIRUN, "-np", str(ranks), sys.executable, WORKER, "mpi", algorithm], ranks,
         env=dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                  OMPI_MCA_rmaps_base_oversubscribe="1"))


def test_deepep_shaped_script_runs_to_the_end():
    """DeepEP's README usage (normal forward/backward, low latency with hooks), only the import
    and the device changed, checked against the dense layer."""
    proc = subprocess.run([sys.executable, os.path.join(HERE, "deep_ep_script.py"), "2"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("DeepEP script OK") == 2, proc.stdout
