"""Run-config options of strategy ``async``: each bad value is refused before any process starts."""

from __future__ import annotations

import pytest

from workbench.core.config import RunConfig

ASYNC = {"model": "mlp", "strategy": "async", "stages": 4, "microbatches": 4, "global_batch": 16}


def test_defaults_and_launch_config():
    config = RunConfig.from_dict(ASYNC)
    assert (config.stash, config.vertical_sync, config.mode, config.inflight) == (True, False, "stash", "auto")
    assert RunConfig.from_dict({**ASYNC, "groups": 2, "global_batch": 32}).world_size == 8
    launch = RunConfig.from_toml("launch/async_gpt2.toml")
    assert launch.strategy == "async" and launch.stages == 4 and launch.world_size == 4


@pytest.mark.parametrize(("changes", "field", "hint"), [
    ({"inflight": 0}, "inflight", "'auto' or an int >= 1"),
    ({"inflight": "many"}, "inflight", "'auto' or an int >= 1"),
    ({"mode": "3bw"}, "mode", "stash, 2bw"),
    ({"mode": "2bw", "microbatches": 2, "global_batch": 8}, "microbatches", "microbatches >= stages"),
    ({"mode": "2bw", "stash": False}, "stash", "set stash = true"),
    ({"mode": "2bw", "vertical_sync": True}, "vertical_sync", "applies to mode 'stash'"),
    ({"vertical_sync": True, "stash": False}, "vertical_sync", "needs stash = true"),
    ({"stages": 1}, "stages", "stages >= 2"),
    ({"grad_accum": 2, "global_batch": 32}, "grad_accum", "set grad_accum = 1"),
    ({"resume": True}, "resume", "set resume = false"),
    ({"memory_cap_mb": -1}, "memory_cap_mb", ">= 0"),
    ({"strategy": "1f1b", "stash": False}, "stash", "only strategy 'async'"),
    ({"strategy": "gropipe", "groups": 2, "global_batch": 32, "mode": "2bw"}, "mode", "only strategy 'async'"),
])
def test_bad_async_options_name_the_field_and_what_is_valid(changes, field, hint):
    with pytest.raises(ValueError, match=f"'{field}'") as info:
        RunConfig.from_dict({**ASYNC, **changes})
    assert hint in str(info.value)
