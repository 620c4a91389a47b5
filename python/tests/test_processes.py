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


EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "moe_layer.py")


def torchrun_command(nproc):
    import torch
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_port", str(free_port())]
    if torch.__version__.startswith("1.") and sys.version_info >= (3, 11):
        # torch 1.x's default --redirects 0 fails on Python 3.11's Flag enum iteration.
        cmd += ["--redirects", "1", "--tee", "1"]
    return cmd


@pytest.mark.parametrize("launch", ["threads", "torchrun", "mpirun"])
def test_example_moe_layer(launch):
    """examples/moe_layer.py: ubep forward == the dense layer on one process."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if launch == "threads":
        cmd = [sys.executable, EXAMPLE, "--dtype", "bf16", "--algo", "bsp"]
    elif launch == "torchrun":
        cmd = torchrun_command(2) + [EXAMPLE]
    else:
        if MPIRUN is None:
            pytest.skip("mpirun not installed")
        pytest.importorskip("mpi4py")
        cmd = [MPIRUN, "-np", "2", sys.executable, EXAMPLE]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" OK") == 2, proc.stdout
