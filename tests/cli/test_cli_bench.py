"""`ortformer bench` keeps the scenarios that need no foreign venv; the peer scenarios and
--setup-peers are usage errors that name the harness command that runs them now."""
import pytest
from support.cli import fail


@pytest.mark.parametrize("scenario", ["real", "serve", "cpu-engines"])
def test_a_peer_scenario_names_the_harness(scenario):
    line = fail("bench", "--scenario", scenario, code=2)
    assert f"run `python -m benchmarks --scenario {scenario}` from a checkout" in line


def test_setup_peers_names_the_harness():
    assert "set up by `python -m benchmarks --setup-peers`" in fail("bench", "--setup-peers", code=2)


def test_an_unknown_scenario_lists_the_own_ones():
    assert "'nope' is not one of 'latency', 'throughput', 'long'" in fail("bench", "--scenario", "nope", code=2)
