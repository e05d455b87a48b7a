"""The tensor-parallel cost model: closed forms, orderings and the memory-cap search (no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workbench.core.costs import DeviceSpec, LinkSpec
from workbench.planning.costs.tensor_costs import (
    TransformerShape, activation_bytes_per_rank, estimate_step, linear_volume_2d, max_batch_under_cap,
    collective_calls, param_bytes_per_rank, simulate_step, step_flops, step_volume_1d, step_volume_2d)

SMALL = TransformerShape(hidden=256, heads=8, layers=4, vocab=1024, positions=128, batch=16, seq=64)
CPU = DeviceSpec("cpu", {"float32": 0.1}, memory_bytes=8 << 30, memory_bandwidth_gbs=20.0, efficiency=1.0)
LINK = LinkSpec("gloo", latency_us=70.0, bandwidth_gbs=1.2)


def test_linear_volume_by_hand():
    # q=2, 64 tokens, 64 -> 256: one activation block [32, 32] and one weight block [32, 128] received.
    assert linear_volume_2d(2, 64, 64, 256) == {"forward_elements": 32 * 32 + 32 * 128, "backward_elements": 2 * (32 * 32 + 32 * 128)}
    assert linear_volume_2d(1, 64, 64, 256)["forward_elements"] == 0


def test_degenerate_grid_and_single_rank_move_nothing():
    assert step_volume_2d(SMALL, 1)["total_elements"] == 0
    assert step_volume_1d(SMALL, 1)["total_elements"] == 0


def test_1d_volume_is_four_activation_all_reduces_per_layer():
    per_layer = (step_volume_1d(SMALL.__class__(**{**SMALL.__dict__, "layers": 5}), 4)["total_elements"]
                 - step_volume_1d(SMALL, 4)["total_elements"])
    assert per_layer == pytest.approx(4 * 2 * 3 / 4 * SMALL.tokens * SMALL.hidden)


def test_2d_summa_volume_follows_q_minus_one_over_q_squared():
    # Per rank, SUMMA moves (q-1)/q² of (T K + K N) per linear: q=4 moves 3/16 against q=2's 1/4.
    v2 = step_volume_2d(SMALL, 2)["summa_forward_elements"]
    v4 = step_volume_2d(SMALL, 4)["summa_forward_elements"]
    assert v4 / v2 == pytest.approx(0.75)


def test_collective_calls_by_hand():
    tiny = TransformerShape(hidden=64, heads=4, layers=2, vocab=256, positions=64, batch=4, seq=16)
    # Forward: 3 table gathers + per layer (2 norms x 4 + 4 linears x 2q broadcasts + 4 bias gathers) + ln_f 4
    # + logits, token count and loss all-reduces; backward: 3 + per layer (2 x 4 + 4 x 4q + 4) + 4.
    assert collective_calls(tiny, "2d", 2) == {"forward": 66, "backward": 95, "total": 161}
    assert collective_calls(tiny, "2d", 2, "allgather")["total"] == 161 - 2 * 4 * (12 - 6)  # 6 instead of 6q per linear
    assert collective_calls(tiny, "1d", 4) == {"forward": 6, "backward": 5, "total": 11}
    assert collective_calls(tiny, "2d", 1)["total"] == 0


def test_params_per_rank_near_dense_over_q_squared():
    dense = param_bytes_per_rank(SMALL, "dense", 1)
    assert dense == SMALL.num_params() * 4
    two_d = param_bytes_per_rank(SMALL, "2d", 2)
    assert abs(two_d - dense / 4) <= 0.10 * dense / 4
    one_d = param_bytes_per_rank(SMALL, "1d", 4)
    assert two_d <= one_d


def test_activations_2d_below_1d_and_scale_with_batch():
    big = SMALL.with_batch(64)
    a2, a1 = activation_bytes_per_rank(big, "2d", 2), activation_bytes_per_rank(big, "1d", 4)
    dense = activation_bytes_per_rank(big, "dense", 1)
    assert a2 < a1 < dense
    assert dense / 4 < a2 < 1.15 * dense / 4  # 1/q² of everything; the grid LayerNorm keeps one tensor more
    assert activation_bytes_per_rank(big.with_batch(128), "2d", 2) == pytest.approx(2 * a2, rel=0.01)


def test_max_batch_under_cap_is_tight_and_favours_2d():
    cap = 256 << 20
    b2, b1 = max_batch_under_cap(SMALL, "2d", 2, cap), max_batch_under_cap(SMALL, "1d", 4, cap)
    assert b2 > b1 > 0
    assert b2 % 2 == 0
    static = param_bytes_per_rank(SMALL, "2d", 2) * 4
    assert static + activation_bytes_per_rank(SMALL.with_batch(b2), "2d", 2) <= cap
    assert static + activation_bytes_per_rank(SMALL.with_batch(b2 + 2), "2d", 2) > cap
    assert max_batch_under_cap(SMALL, "2d", 2, 1) == 0


def test_estimate_step_splits_compute_and_prices_communication():
    dense = estimate_step(SMALL, "dense", 1, CPU, LINK)
    two_d = estimate_step(SMALL, "2d", 2, CPU, LINK, overlap=0.5)
    one_d = estimate_step(SMALL, "1d", 4, CPU, LINK)
    assert dense["comm_ms"] == 0 and dense["flops_per_rank"] == step_flops(SMALL)
    assert two_d["flops_per_rank"] == pytest.approx(dense["flops_per_rank"] / 4)
    assert one_d["flops_per_rank"] == pytest.approx(dense["flops_per_rank"] / 4)
    assert two_d["step_ms"] == pytest.approx(two_d["compute_ms"] + 0.5 * two_d["comm_ms"])
    assert two_d["memory_bytes"] < one_d["memory_bytes"]


@pytest.mark.parametrize("mode, degree, ranks", [("2d", 2, 4), ("1d", 4, 4), ("dense", 1, 1)])
def test_simulated_timeline_adds_up_to_the_estimate(mode, degree, ranks):
    timeline = simulate_step(SMALL, mode, degree, CPU, LINK, overlap=0.25)
    estimate = estimate_step(SMALL, mode, degree, CPU, LINK, overlap=0.25)
    assert sorted({e.rank for e in timeline.events}) == list(range(ranks))
    last = max(e.end for e in timeline.events if e.rank == 0)
    assert last == pytest.approx(estimate["step_ms"])
    assert sum(e.nbytes or 0 for e in timeline.events if e.rank == 0) == pytest.approx(estimate["comm_bytes"], rel=1e-6, abs=SMALL.layers * 2)
    assert [e.chunk for e in timeline.events if e.rank == 0 and e.op == "B"] == list(reversed(range(SMALL.layers)))


@pytest.mark.parametrize("kwargs, field", [
    (dict(hidden=0), "hidden"), (dict(hidden=100, heads=3), "hidden"), (dict(dtype="int8"), "dtype")])
def test_bad_shapes_are_refused(kwargs, field):
    base = dict(hidden=64, heads=4, layers=1, vocab=10, positions=8, batch=1, seq=8)
    with pytest.raises(ValueError, match=field):
        TransformerShape(**{**base, **kwargs})


def test_bad_mode_and_overlap_are_refused():
    with pytest.raises(ValueError, match="mode"):
        param_bytes_per_rank(SMALL, "3d", 2)
    with pytest.raises(ValueError, match="overlap"):
        estimate_step(SMALL, "2d", 2, CPU, LINK, overlap=1.5)


def test_module_does_not_import_torch():
    code = "import sys, workbench.planning.costs.tensor_costs; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
