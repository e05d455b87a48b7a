"""CPU ranks get cores of their own when every rank of the node can have one, and say which in their start line."""

from __future__ import annotations

import os

import pytest
import torch

from runtime_launch import run_ok
from workbench.runtime import entry
from workbench.runtime.events import read_events


@pytest.fixture
def fake_cores(monkeypatch):
    """Eight usable cores; the affinity a call sets is recorded instead of applied."""
    pinned: list[list[int]] = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: pinned.append(list(cores)))
    monkeypatch.delenv(entry.PIN_CORES_ENV, raising=False)
    return pinned


@pytest.mark.parametrize(("local_world", "local", "expected"), [
    (2, 0, [0, 1, 2, 3]), (2, 1, [4, 5, 6, 7]), (4, 3, [6, 7]), (8, 5, [5]), (3, 2, [4, 5]),
])
def test_each_local_rank_gets_its_own_share_of_the_cores(monkeypatch, fake_cores, local_world, local, expected):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    monkeypatch.setenv("LOCAL_RANK", str(local))
    assert entry.pin_cpu_rank(torch.device("cpu")) == expected
    assert fake_cores == [expected]


@pytest.mark.parametrize(("device", "local_world", "switch"), [
    ("cpu", 16, None),  # more ranks than cores: they must share, so none is pinned
    ("cpu", 1, None),  # a single rank keeps every core
    ("cpu", 2, "0"),  # switched off
    ("cuda", 2, None),  # GPU ranks are left to their GPUs
])
def test_no_pinning_where_ranks_must_share_or_it_is_switched_off(monkeypatch, fake_cores, device, local_world, switch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    monkeypatch.setenv("LOCAL_RANK", "0")
    if switch is not None:
        monkeypatch.setenv(entry.PIN_CORES_ENV, switch)
    assert entry.pin_cpu_rank(torch.device(device)) is None
    assert fake_cores == []


@pytest.mark.multiproc
def test_two_ranks_of_a_real_run_report_cores_of_their_own(tmp_path):
    run_ok(tmp_path, 2, plan="pp2-1f1b-m2", training={"steps": 2})
    cores = [[e for e in read_events(tmp_path, r) if e["kind"] == "start"][-1]["cores"] for r in range(2)]
    if len(os.sched_getaffinity(0)) < 2:
        assert cores == [None, None]
    else:
        assert all(cores) and not set(cores[0]) & set(cores[1]), cores
