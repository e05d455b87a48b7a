"""``workbench partition`` and ``workbench simulate`` from the command line."""

import json

import pytest

from workbench.cli import main
from workbench.core.costs import LayerCost, ModelCosts


@pytest.fixture
def costs_file(tmp_path):
    layers = [LayerCost(f"l{i}", forward_ms=1.0 + (i == 7) * 5, backward_ms=2.0 + (i == 7) * 10,
                        param_bytes=10**7, activation_bytes=10**6, saved_bytes=10**6) for i in range(8)]
    path = tmp_path / "costs.json"
    ModelCosts("toy", batch_size=8, device="cpu", layers=tuple(layers)).save(path)
    return str(path)


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_partition_json(capsys, costs_file):
    data = run_json(capsys, "partition", costs_file, "--stages", "2", "--microbatches", "2")
    # micro-batches of 4 halve the profile's times: the heavy last layer costs 9 ms, a light one 1.5 ms
    assert data["partition"] in ("0-6|7-7", "0-5|6-7")
    assert data["stages"][0]["layers"][0] == 0 and data["stages"][1]["layers"][1] == 7
    assert data["bottleneck_ms"] == pytest.approx(10.5) and data["stages"][0]["memory_bytes"] > 0


def test_partition_text_and_baselines(capsys, costs_file):
    assert main(["partition", costs_file, "--stages", "2", "--algorithm", "uniform"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("0-3|4-7") and "<- bottleneck" in out
    data = run_json(capsys, "partition", costs_file, "--stages", "2", "--algorithm", "manual", "--partition", "0-5|6-7")
    assert data["partition"] == "0-5|6-7"


@pytest.mark.parametrize("argv, message", [
    (["--stages", "9"], "more stages than"),
    (["--stages", "2", "--microbatches", "3"], "does not divide the batch"),
    (["--stages", "2", "--memory-cap", "0.01"], "over the cap"),
])
def test_partition_bad_input(capsys, costs_file, argv, message):
    assert main(["partition", costs_file, *argv]) == 2
    assert message in capsys.readouterr().err


def test_simulate_uniform_json_matches_formula(capsys):
    data = run_json(capsys, "simulate", "--plan", "pp4-1f1b-m8")
    assert data["bubble_fraction"] == pytest.approx([3 / 11] * 4)
    assert set(data) >= {"iteration_ms", "throughput", "bubble_fraction", "peak_memory_bytes"}


def test_simulate_with_costs_cluster_figure_and_trace(capsys, costs_file, tmp_path):
    html, trace = tmp_path / "t.html", tmp_path / "t.json"
    data = run_json(capsys, "simulate", "--plan", "gropipe-2x2-1f1b-m2-d1", "--iterations", "2", "--costs", costs_file,
                    "--partition", "0-5|6-7",
                    "--cluster", "local-cpu", "--html", str(html), "--trace", str(trace))
    assert len(data["peak_memory_bytes"]) == 4 and data["iteration_ms"] > 0
    assert "gloo-allreduce" in data["comm_bytes_by_link"]
    assert "plotly" in html.read_text() and json.loads(trace.read_text())["traceEvents"]


@pytest.mark.parametrize("argv, message", [
    (["--plan", "pp4-interleaved-v2-m6"], "multiple of pp"),
    (["--plan", "pp2-1f1b-m0"], "'microbatches' = 0"),
    (["--plan", "pp2-zbv-m4-L[]"], "lists no layers"),
    (["--plan", "pp4-dualpipev-m4"], "at least 2 x pp = 8 micro-batches"),
    (["--plan", "pp2-1f1b-m4", "--iterations", "0"], "--iterations must be >= 1"),
    (["--plan", "pp9-1f1b-m4", "--cluster", "8xV100-PCIe"], "needs 9 ranks"),
])
def test_simulate_bad_input(capsys, argv, message):
    assert main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_simulate_partition_must_match_stage_count(capsys, costs_file):
    assert main(["simulate", "--plan", "pp3-1f1b-m4", "--costs", costs_file, "--partition", "0-3|4-7"]) == 2
    assert "needs 3" in capsys.readouterr().err
