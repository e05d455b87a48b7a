"""The planner reports how far it has got, and an interruption leaves it with the best plans so far."""

from __future__ import annotations

import io

import pytest

from workbench.core.costs import ModelCosts
from workbench.planning import Budget, SearchOptions, Workload, plan
from workbench.planning.strategy.progress import SearchProgress, terminal_bar

COSTS = ModelCosts.uniform(16, forward_ms=1.0, backward_ms=2.0, param_bytes=20_000_000, activation_bytes=2_000_000,
                           batch_size=8)
WORK = Workload(COSTS, 64)


def test_every_phase_is_reported_from_nothing_to_all_of_it():
    seen: list[tuple[str, int, int]] = []
    result = plan(WORK, "2x8xH100-IB", Budget(), SearchOptions(fine_grained=True),
                  progress=lambda *step: seen.append(step))
    phases = list(dict.fromkeys(phase for phase, _, _ in seen))
    assert phases == ["projecting", "simulating", "per-layer search"]
    for phase in phases:
        steps = [(done, total) for p, done, total in seen if p == phase]
        assert [d for d, _ in steps] == list(range(len(steps))) and steps[-1][0] == steps[-1][1]
    assert dict((p, t) for p, _, t in seen)["projecting"] == result.searched
    assert not result.interrupted and "interrupted" not in " ".join(result.notes)


def test_an_interruption_ranks_what_was_found_and_says_so():
    whole = plan(WORK, "2x8xH100-IB", Budget())

    def stop_halfway(phase: str, done: int, total: int) -> None:
        if phase == "projecting" and done == total // 2:
            raise KeyboardInterrupt

    half = plan(WORK, "2x8xH100-IB", Budget(), progress=stop_halfway)
    assert half.interrupted and half.to_dict()["interrupted"]
    assert half.notes[0].startswith(f"interrupted: the best plans found so far (projecting stopped after "
                                    f"{whole.searched // 2} of {whole.searched})")
    assert 0 < len(half.plans) <= whole.searched // 2
    # the simulation phase never ran (data parallelism is simulated when projected: it has no closed form)
    assert all(p.estimate.method != "simulated" or p.strategy.pp == 1 for p in half.plans)
    assert {p.name for p in half.plans} <= {p.name for p in whole.plans} | {i["name"] for i in whole.infeasible}


def test_an_interruption_before_any_estimate_is_an_interruption():
    def stop(phase: str, done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt, match="before any plan"):
        plan(WORK, "2x8xH100-IB", Budget(), progress=stop)
    with pytest.raises(ValueError, match="progress must be a function"):
        SearchProgress("bar")


def test_the_terminal_bar_draws_in_place_and_clears_its_line():
    out = io.StringIO()
    bar = terminal_bar(out, width=10, every_s=0.0)
    bar("projecting", 0, 4)
    bar("projecting", 2, 4)
    assert out.getvalue().endswith("\rprojecting         [#####.....] 2/4")
    bar("projecting", 4, 4)
    assert out.getvalue().endswith("\r") and out.getvalue().split("\r")[-2].strip() == ""
