"""Lesson 08's helpers: Slurm's usable nodes from sinfo, and the lesson's spec made into one Slurm can run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from workbench.core.config import RunConfig
from workbench.jobs import LaunchSpec
from workbench.lessons import scale_out
from workbench.lessons.scale_out import slurm_nodes, slurm_spec, usable_nodes

ROOT = Path(__file__).resolve().parents[2]


def test_usable_nodes_count_the_states_that_can_take_a_job():
    assert usable_nodes("2 idle\n1 mix*\n3 alloc\n1 comp~\n4 down\n2 drain\n1 idle#\n") == 2 + 1 + 3 + 1 + 1
    assert usable_nodes("") == 0
    assert usable_nodes("garbage\n1 idle extra\n") == 0


def _fake_sinfo(monkeypatch, *, installed=True, returncode=0, stdout="", stderr=""):
    calls = []
    monkeypatch.setattr(scale_out.shutil, "which", lambda name: "/usr/bin/sinfo" if installed else None)

    def run(args, **kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, returncode, stdout, stderr)

    monkeypatch.setattr(scale_out.subprocess, "run", run)
    return calls


def test_slurm_nodes_says_why_none_answered(monkeypatch):
    _fake_sinfo(monkeypatch, installed=False)
    assert slurm_nodes() == (0, "sinfo is not installed")
    _fake_sinfo(monkeypatch, returncode=1, stderr="slurm_load_partitions: Unable to contact slurm controller\n")
    assert slurm_nodes() == (0, "slurm_load_partitions: Unable to contact slurm controller")
    _fake_sinfo(monkeypatch, stdout="2 down\n")
    assert slurm_nodes() == (0, "no nodes")
    calls = _fake_sinfo(monkeypatch, stdout="1 idle\n1 mix\n")
    assert slurm_nodes() == (2, "")
    assert calls == [["sinfo", "-h", "-o", "%D %t"]]


@pytest.fixture
def spec(tmp_path):
    config = RunConfig.from_toml(ROOT / "launch" / "gropipe_vgg.toml")
    return LaunchSpec(config=config, nnodes=2, run_root=str(tmp_path / "runs"))


def test_the_slurm_spec_spans_the_nodes_when_there_are_enough(spec, tmp_path):
    live = slurm_spec(spec, 3, shared_run_root=str(tmp_path / "shared"), run_root=str(tmp_path / "local"))
    assert (live.nnodes, live.nproc_per_node, live.world_size) == (2, 2, 4)
    assert live.dist_backend == "gloo" and live.run_root == str(tmp_path / "shared")
    assert live.slurm.time == "00:10:00" and live.slurm.partition is None


def test_the_slurm_spec_runs_on_one_node_when_there_are_too_few(spec, tmp_path):
    live = slurm_spec(spec, 1, shared_run_root=str(tmp_path / "shared"), run_root=str(tmp_path / "local"))
    assert (live.nnodes, live.nproc_per_node, live.world_size) == (1, 4, 4)
    assert live.run_root == str(tmp_path / "local")
