"""Across real (virtual) hosts from Python (docs/BACKENDS.md, "Virtual hosts"): the suites of
test_hosts.py on 2 and 3 hosts x 2 ranks made by scripts/vhosts.sh -- every host its own network,
IPC, mount (private /dev/shm) and UTS namespace (hostname vh<i>), joined by veths to a bridge --
with the hosts found by ubep, not forced: both layouts, both algorithms, fp8, every row against
the NumPy reference with its per-host combine order; ubep.deep_ep's normal and low-latency
modes; python3 -m ubep.bench --topology 2x2. Skipped, with the reason, where namespaces cannot be
made (no root / CAP_SYS_ADMIN) or mpirun / mpi4py are missing. ctest python_vhosts (label
vhosts)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import hosts_worker as hw
import test_hosts as th
import worker

HERE = os.path.dirname(os.path.abspath(__file__))
VHOSTS = os.path.join(HERE, "..", "..", "scripts", "vhosts.sh")


def vhosts_or_skip():
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    pytest.importorskip("mpi4py")
    proc = subprocess.run([VHOSTS, "check"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(proc.stdout.strip() or proc.stderr.strip())


def run_on_vhosts(hosts, per_host, args, timeout=300):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               UBEP_TEST_HOSTS=str(hosts))
    return subprocess.run([VHOSTS, "run", str(hosts), str(per_host)] + args,
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("hosts", [2, 3])
def test_native_fp8_deep_ep_on_virtual_hosts(tmp_path, hosts):
    vhosts_or_skip()
    n = hosts * hw.RPH
    proc = run_on_vhosts(hosts, hw.RPH, [sys.executable, os.path.join(HERE, "hosts_worker.py"),
                                         str(tmp_path)])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert proc.stdout.count("hosts OK") == n, out
    assert proc.stdout.count(": OK (8 low-latency configs, normal mode)") == n, out
    for seed, (name, layout, _, _, dtype, _) in enumerate(hw.NATIVE):
        worker.check(hw.spec_of(dtype, seed + 20, n), layout, worker.load(tmp_path / name, n))
    for seed, (name, layout, _) in enumerate(hw.FP8):
        th.check_fp8(hw.spec_of("bf16", seed + 40, n), layout, worker.load(tmp_path / name, n))
    # Real hosts are found by their names without MPI too, and refused (hosts_worker.py).
    assert not (tmp_path / "nompi").exists()


def test_bench_topology_on_virtual_hosts(tmp_path):
    """python3 -m ubep.bench --topology 2x2 on 2 virtual hosts: the hosts found by MPI (not
    forced), ubep, bsp, the MPI baseline and torch side by side, ubep's results bit-identical to
    the baseline's."""
    vhosts_or_skip()
    out = tmp_path / "b.json"
    proc = run_on_vhosts(2, 2, [sys.executable, "-m", "ubep.bench", "--topology", "2x2",
                                "--workload", "tiny", "--iters", "3", "--warmup", "1",
                                "--json", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(out.read_text())
    cfg = rep["config"][0]
    assert cfg["topology"] == "2x2" and "found by MPI" in cfg["group"], cfg
    impls = {(r["impl"], r["op"]) for r in rep["results"]}
    assert impls == {(i, o) for i in ("ubep", "bsp", "mpi", "torch")
                     for o in ("dispatch", "combine")}
    (ident,) = rep["identity"]
    assert ident["y_vs_mpi"] == 0 and ident["elements"] == 4 * 7168, ident
    assert "rows_vs_one_host" not in ident, ident  # real hosts: no one-host group to compare

