"""The planner's predictions are golden: representing plans as ParallelPlan values changed none of them.

``golden/plans.json`` was written by ``golden_plans.py`` before the plan
became a typed value; every plan the search ranks for its fixed cost models
must keep its name, predicted iteration time, memory and partition. It was
written again, on purpose, when pipelines that stream several iterations
(async, delayed GroPipe) began to be timed from their steady iterations:
the processor sharing of the iterations between fill and drain, and enough
iterations for an async pipeline with fewer micro-batches than stages to
fill (120 of the 421 plans changed their time, all async or delayed
GroPipe, and 7 async ones their memory). And again when a message between
ranks time-sharing cores began to wait for its receiver to get a core
(``collective_call_ms`` times the oversubscription at its arrival): 231 of
the 421 plans, every pipeline on the 4-rank CPU clusters, changed their time
(x0.995 to x1.456), none their memory. And when, on clusters whose ranks
share cores, the world size became an upper bound: the three 4-rank CPU
cases gained the plans on 1 and 2 ranks (301 plans; 720 in all), and no
plan recorded before changed. And when, on those clusters, a gloo
all-reduce began to count as work on the cores it shares
(``COLLECTIVE_CPU_SHARE``, stretched by the threads runnable beside it):
150 of the 902 plans, those with data-parallel all-reduces on the 4-rank
CPU clusters, changed their time (x1.036 to x1.567), none their memory.
"""

import json
from pathlib import Path

import pytest

from golden_plans import golden

GOLDEN = json.loads((Path(__file__).parent / "golden" / "plans.json").read_text())


@pytest.fixture(scope="module")
def today():
    return golden()


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_every_ranked_plan_keeps_its_prediction(case, today):
    expected, got = GOLDEN[case], today[case]
    assert sorted(got) == sorted(expected)
    for name, values in expected.items():
        assert got[name]["iteration_ms"] == pytest.approx(values["iteration_ms"], rel=1e-9), name
        assert {k: v for k, v in got[name].items() if k != "iteration_ms"} == \
            {k: v for k, v in values.items() if k != "iteration_ms"}, name
