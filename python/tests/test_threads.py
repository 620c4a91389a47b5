"""Thread ranks: every layout, algorithm, framework and dtype, bit-identical to the NumPy
reference over several calls."""
import pytest

import reference as ref
import ubep
import worker


@pytest.mark.parametrize("framework", ["torch", "numpy"])
@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("layout", ["throughput", "latency"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_matches_reference(layout, algorithm, framework, dtype):
    spec = ref.Spec(ranks=2, dtype=dtype)
    got = ubep.run_on_threads(
        2, lambda g: worker.run_rank(g, spec, layout, algorithm, framework), timeout=30)
    worker.check(spec, layout, got)
    for rank_results in got:
        for it in rank_results:
            if algorithm == "ubep":
                assert it["barriers"] == 0
            else:
                assert it["barriers"] > 0


@pytest.mark.parametrize("ranks", [3, 4])
def test_more_ranks(ranks):
    spec = ref.Spec(ranks=ranks, experts=12 if ranks == 3 else 8, topk=4, dtype="bf16", seed=5)
    for layout in ("throughput", "latency"):
        got = ubep.run_on_threads(
            ranks, lambda g: worker.run_rank(g, spec, layout, "ubep", "torch"), timeout=30)
        worker.check(spec, layout, got)


@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("layout", ["throughput", "latency"])
def test_two_hosts_over_the_relay(algorithm, layout):
    """4 thread ranks as 2 hosts of 2: traffic between them takes the cross-host relay, and
    combine adds per-host partials (the reference models that order)."""
    spec = ref.Spec(ranks=4, experts=8, topk=3, dtype="fp32", seed=8, ranks_per_host=2)
    got = ubep.run_on_threads(
        4, lambda g: worker.run_rank(g, spec, layout, algorithm, "torch"), timeout=30,
        ranks_per_host=2)
    worker.check(spec, layout, got)


@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("framework", ["torch", "numpy"])
def test_per_source_placement(algorithm, framework):
    """placement="per-source" (ubep's default for the latency layout under "auto")."""
    spec = ref.Spec(ranks=3, experts=6, topk=2, dtype="bf16", seed=6)
    got = ubep.run_on_threads(3, lambda g: worker.run_rank(
        g, spec, "latency", algorithm, framework, placement="per-source"), timeout=30)
    worker.check(spec, "latency", got, placement="per-source")


@pytest.mark.parametrize("algorithm", ["ubep", "bsp"])
@pytest.mark.parametrize("framework", ["torch", "numpy"])
def test_split_phase_hooks(algorithm, framework):
    """return_recv_hook=True: recv_x/recv_count/y are filled once the hooks return."""
    spec = ref.Spec(ranks=2, dtype="bf16", seed=3)
    got = ubep.run_on_threads(
        2, lambda g: worker.run_rank(g, spec, "latency", algorithm, framework, hook=True),
        timeout=30)
    worker.check(spec, "latency", got)


@pytest.mark.parametrize("framework", ["torch", "numpy"])
def test_weights_given_to_combine_and_copy_input(framework):
    """DeepEP passes the weights to low_latency_combine, not to dispatch; and a combine input
    outside the zero-copy buffer."""
    spec = ref.Spec(ranks=2, dtype="fp32", seed=4)
    got = ubep.run_on_threads(
        2, lambda g: worker.run_rank(g, spec, "latency", "ubep", framework, zero_copy=False,
                                     weights_at_combine=True), timeout=30)
    worker.check(spec, "latency", got)
