"""pip install --no-build-isolation . into a fresh venv (--system-site-packages: Debian's numpy
and torch), then import ubep.deep_ep there, outside the source tree; pip uninstall removes it.
setup.py builds the extension in the CMake tree under test (UBEP_CMAKE_BUILD_DIR), so this
checks the packaging without a second full build."""
import os
import subprocess
import sys

import pytest

import ubep

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(ubep.__file__))))


@pytest.mark.skipif(not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")),
                    reason="ubep is not imported from a CMake build tree")
def test_pip_install_into_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["UBEP_CMAKE_BUILD_DIR"] = BUILD

    def run(*args):
        p = subprocess.run(args, capture_output=True, text=True, env=env, cwd=str(tmp_path),
                           timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout

    run(py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-cache-dir",
        ROOT)
    out = run(py, "-c", "import ubep, ubep.deep_ep as d; print(ubep.__file__); "
                        "print(d.Buffer.get_low_latency_rdma_size_hint(128, 7168, 2, 256))")
    where, hint = out.split()
    assert where.startswith(str(venv)) and int(hint) > 0
    # The vLLM plugin entry point (docs/INTEGRATIONS.md, "vLLM on CPU"): declared, and its
    # target resolves (vLLM itself is not needed to import ubep.vllm_ep).
    out = run(py, "-c", "from importlib.metadata import entry_points as e; "
                        "p = [x for x in e(group='vllm.general_plugins') if x.name == 'ubep']; "
                        "print(p[0].value, callable(p[0].load()))")
    assert out.split() == ["ubep.vllm_ep:register", "True"], out
    run(py, "-m", "pip", "uninstall", "-y", "ubep")
    p = subprocess.run([py, "-c", "import ubep"], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path))
    assert p.returncode != 0 and "No module named 'ubep'" in p.stderr
