"""The staged process group (ranks sharing a GPU) on CPU tensors: every operation equals plain gloo's.

Four spawned ranks initialise the ``staged`` backend, the one ranks sharing
a GPU use, with CPU tensors (the path is the same: host copies, gloo on
them, results copied back). Each collective, the object collectives, a ring
of point-to-point messages and a subgroup run once on the staged group and
once on a plain gloo group with the same inputs; the results must be equal.
Every strategy on top of it runs in ``test_staged_runs.py``.
"""

from __future__ import annotations

import json

import pytest

import staging_workers
from runtime_launch import forked_ranks

pytestmark = [pytest.mark.multiproc]
WORLD = 4


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("staging")
    forked_ranks(staging_workers.worker, (WORLD, str(root / "init"), str(root)), WORLD, ["staging_workers"])
    return [json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_the_default_group_is_the_staged_one(ranks):
    for result in ranks:
        assert result["is_staged"] and result["backend"] == "staged", result["staged_type"]
    assert [r["subgroup_backend"] for r in ranks] == ["staged", None, "staged", None]


def test_every_operation_equals_plain_gloo(ranks):
    """All but the non-contiguous view, which plain gloo reduces as if it were contiguous (the staged group
    copies it out and back, see the arithmetic below)."""
    for rank, result in enumerate(ranks):
        staged, gloo = result["staged"], result["gloo"]
        assert sorted(staged) == sorted(gloo)
        for name in gloo:
            if name != "all_reduce_view":
                assert staged[name] == gloo[name], (rank, name)


def test_the_results_are_the_collectives_own(ranks):
    """Spot checks against arithmetic, so that equal-but-wrong results on both groups cannot pass."""
    total = sum(r + 1 for r in range(WORLD))
    offset = sum(range(WORLD))
    first = ranks[0]["staged"]
    assert first["all_reduce"][0] == [i * total + offset for i in range(4)]
    assert ranks[2]["staged"]["ring_exchange"] == [i * 2 + 1 for i in range(6)]  # from rank 1: x * 2 + 1
    assert ranks[1]["staged"]["broadcast"] == [[3.0, 7.0], [11.0, 15.0]]  # rank 3's: x * 4 + 3
    assert ranks[0]["staged"]["gather"] == [[r, r + (r + 1)] for r in range(WORLD)]
    assert ranks[3]["staged"]["broadcast_object_list"] == ["from 0"]
    assert ranks[0]["staged"]["reduce"] == [sum(i * (r + 1) + r for r in range(WORLD)) for i in range(3)]
    # the non-contiguous view got the maximum (rank 3's column), the rest of the tensor stayed this rank's
    view = ranks[0]["staged"]["all_reduce_view"]
    assert [row[1] for row in view] == [(3 * i + 1) * 4 + 3 for i in range(4)]
    assert [row[0] for row in view] == [3 * i for i in range(4)]
    assert ranks[0]["sub_all_reduce"] == ranks[2]["sub_all_reduce"] == [2.0, 2.0, 2.0]
