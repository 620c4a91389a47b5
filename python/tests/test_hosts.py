"""Across hosts from Python (docs/PYTHON.md, "Across hosts"): 4 mpirun processes as 2 forced
hosts over TCP (hosts_worker.py) -- both layouts, both algorithms, fp8, every row against the
NumPy reference with its per-host combine order, ubep.deep_ep's normal and low-latency modes;
the MPI library check; a torch.distributed group spanning hosts refused at set-up."""
import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

import fp8_reference as f8
import hosts_worker as hw
import reference as ref
import worker
from ubep import InvalidArgument, groups

HERE = os.path.dirname(os.path.abspath(__file__))
MPIRUN = shutil.which("mpirun")


def check_fp8(spec, layout, got):
    """fp8 rows: the codes and scales of the independent model (fp8_reference.py) of the rows
    the bf16 reference puts there; counts, sources and the bf16 combine as the reference."""
    want = worker.expected(spec, layout)
    for it in range(worker.ITERS):
        for r in range(spec.R):
            g, e = got[r][it], want[it][r]
            what = f"{layout} it {it} rank {r}"
            np.testing.assert_array_equal(g["recv_count"], e["recv_count"], err_msg=what)
            np.testing.assert_array_equal(g["y"], e["y"], err_msg=what)
            rows = ref.bf16_value(e["recv_x"]).reshape(-1, spec.H)
            codes, scales = f8.quantize(rows)
            codes = codes.reshape(e["recv_x"].shape)
            scales = scales.reshape(e["recv_x"].shape[:-1] + (scales.shape[-1],))
            v = e["valid"] if layout == "latency" else slice(None)
            np.testing.assert_array_equal(g["codes"][v], codes[v], err_msg=what)
            np.testing.assert_array_equal(g["scales"][v], scales[v], err_msg=what)
            np.testing.assert_array_equal(g["recv_src"][v], e["recv_src"][v], err_msg=what)


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed")
def test_mpirun_two_forced_hosts_over_tcp(tmp_path):
    pytest.importorskip("mpi4py")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    proc = subprocess.run([MPIRUN, "-np", "4", "--mca", "btl", "tcp,self", sys.executable,
                           os.path.join(HERE, "hosts_worker.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("hosts OK") == 4, proc.stdout + proc.stderr
    # ubep.deep_ep: its checks ran on every rank (deep_ep_worker.run prints after them).
    assert proc.stdout.count(": OK (8 low-latency configs, normal mode)") == 4, proc.stdout
    for seed, (name, layout, _, _, dtype, _) in enumerate(hw.NATIVE):
        worker.check(hw.spec_of(dtype, seed + 20), layout, worker.load(tmp_path / name, 4))
    for seed, (name, layout, _) in enumerate(hw.FP8):
        check_fp8(hw.spec_of("bf16", seed + 40), layout, worker.load(tmp_path / name, 4))
    # Without MPI in the extension: one host over mpi4py's collectives, same bits.
    worker.check(ref.Spec(ranks=4, experts=8, topk=3, seed=50), "latency",
                 worker.load(tmp_path / "nompi", 4))


def test_mpi_library_mismatch_is_named():
    groups.check_same_mpi("Open MPI v4.1.4, package: Debian\n",
                          " Open MPI v4.1.4,  package: Debian")
    with pytest.raises(InvalidArgument) as e:
        groups.check_same_mpi("MPICH Version: 4.0.2", "Open MPI v4.1.4, package: Debian")
    msg = str(e.value)
    assert "mpi4py's is 'MPICH Version: 4.0.2'" in msg and "'Open MPI v4.1.4" in msg, msg


def test_torch_group_spanning_hosts_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, os.path.join(HERE, "hosts_worker.py"), "torch",
                           str(port)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("torch refusal OK") == 2, proc.stdout + proc.stderr


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed")
def test_bench_under_mpirun_two_forced_hosts(tmp_path):
    """python3 -m ubep.bench --topology 2x2 under mpirun: ubep, bsp, the MPI baseline and torch
    side by side, ubep's results bit-identical to the baseline's and its received rows to a
    one-host group's."""
    pytest.importorskip("mpi4py")
    out = tmp_path / "b.json"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    proc = subprocess.run([MPIRUN, "-np", "4", "--mca", "btl", "tcp,self", sys.executable, "-m",
                           "ubep.bench", "--topology", "2x2", "--workload", "tiny", "--iters",
                           "3", "--warmup", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(out.read_text())
    assert rep["config"][0]["topology"] == "2x2" and "forced" in rep["config"][0]["group"]
    impls = {(r["impl"], r["op"]) for r in rep["results"]}
    assert impls == {(i, o) for i in ("ubep", "bsp", "mpi", "torch")
                     for o in ("dispatch", "combine")}
    for r in rep["results"]:
        assert r["median_us"] > 0 and r["p99_us"] >= r["median_us"]
    (ident,) = rep["identity"]
    assert ident["y_vs_mpi"] == 0 and ident["rows_vs_one_host"] == 0, ident
    assert ident["rows"] > 0 and ident["elements"] == 4 * 7168, ident


def test_bench_topology_needs_mpirun():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_"))}
    proc = subprocess.run([sys.executable, "-m", "ubep.bench", "--topology", "2x2"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0 and "mpirun -np N" in proc.stderr, proc.stderr
