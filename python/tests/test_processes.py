"""Two processes: torch.multiprocessing with a gloo process group, and mpirun with mpi4py.
Each rank runs worker.run_rank; the results are checked here against the NumPy reference."""
import os
import shutil
import socket
import subprocess
import sys

import pytest

import reference as ref
import worker

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torch_distributed_two_processes(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "worker.py"), "torch",
                           str(tmp_path), str(free_port())], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spec = ref.Spec(ranks=2, dtype="bf16")
    for layout, algorithm, hook in worker.CONFIGS:
        got = worker.load(f"{tmp_path}/{layout}-{algorithm}-{hook}", 2)
        worker.check(spec, layout, got)


MPIRUN = shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed")
@pytest.mark.parametrize("layout,algorithm,framework,dtype", [
    ("latency", "ubep", "numpy", "bf16"), ("throughput", "bsp", "numpy", "fp32")])
def test_mpirun_two_processes(tmp_path, layout, algorithm, framework, dtype):
    pytest.importorskip("mpi4py")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    out = str(tmp_path / "res")
    proc = subprocess.run([MPIRUN, "-np", "2", sys.executable, os.path.join(HERE, "worker.py"),
                           "mpi", out, layout, algorithm, framework, dtype],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    worker.check(ref.Spec(ranks=2, dtype=dtype), layout, worker.load(out, 2))
