"""Run-config options of the asynchronous pipeline: each bad value is refused before any process starts."""

from __future__ import annotations

import re

import pytest

from workbench.core.config import RunConfig
from workbench.core.plan import AsyncPipeline

ASYNC = {"model": "mlp", "plan": "async-1x4-m4", "training": {"global_batch": 16}}


def async_plan(pp: int = 4, dp: int = 1, microbatches: int = 4, **options) -> dict:
    """A [plan] table of the asynchronous pipeline with ``options`` in its [plan.pipeline]."""
    return {"mesh": {"dp": dp, "pp": pp}, "microbatches": microbatches, "pipeline": {"kind": "async", **options}}


def test_defaults_and_launch_config():
    config = RunConfig.from_dict(ASYNC)
    spec = config.plan.pipeline
    assert isinstance(spec, AsyncPipeline)
    assert (spec.stash, spec.vertical_sync, spec.mode, spec.inflight) == (True, False, "stash", "auto")
    assert RunConfig.from_dict({**ASYNC, "plan": "async-2x4-m4", "training": {"global_batch": 32}}).world_size == 8
    assert RunConfig.from_dict({**ASYNC, "plan": async_plan()}) == config
    launch = RunConfig.from_toml("launch/async_gpt2.toml")
    assert launch.plan.family == "async" and launch.plan.pp == 4 and launch.world_size == 4


@pytest.mark.parametrize(("changes", "field", "hint"), [
    ({"plan": async_plan(inflight=0)}, "pipeline.inflight", "'auto', an int >= 1"),
    ({"plan": async_plan(inflight="many")}, "pipeline.inflight", "'auto', an int >= 1"),
    ({"plan": async_plan(mode="3bw")}, "pipeline.mode", "stash, 2bw"),
    ({"plan": async_plan(microbatches=2, mode="2bw"), "training": {"global_batch": 8}}, "microbatches",
     "microbatches >= pp"),
    ({"plan": async_plan(mode="2bw", stash=False)}, "pipeline.stash", "set stash = true"),
    ({"plan": async_plan(mode="2bw", vertical_sync=True)}, "pipeline.vertical_sync", "applies to mode 'stash'"),
    ({"plan": async_plan(vertical_sync=True, stash=False)}, "pipeline.vertical_sync", "needs stash = true"),
    ({"plan": async_plan(pp=1)}, "mesh.pp", "pp >= 2"),
    ({"training": {"grad_accum": 2, "global_batch": 32}}, "training.grad_accum", "set grad_accum = 1"),
    ({"training": {"global_batch": 16, "resume": True}}, "training.resume", "set resume = false"),
    ({"plan": async_plan(memory_cap_mb=-1)}, "pipeline.memory_cap_mb", ">= 0"),
    ({"plan": {**async_plan(), "pipeline": {"kind": "1f1b", "stash": False}}}, "pipeline.stash",
     "'1f1b' has no such field"),
    ({"plan": {**async_plan(dp=2), "pipeline": {"kind": "gropipe", "mode": "2bw"}}, "training": {"global_batch": 32}},
     "pipeline.mode", "'gropipe' has no such field"),
])
def test_bad_async_options_name_the_field_and_what_is_valid(changes, field, hint):
    with pytest.raises(ValueError, match=re.escape(f"'{field}'")) as info:
        RunConfig.from_dict({**ASYNC, **changes})
    assert hint in str(info.value)
