"""A zoo model's profile is found again without building the model or importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

import pytest

from workbench.profiling import zoo_profiles
from workbench.profiling.zoo_profiles import index_key, indexed_profile, profile_zoo


def test_the_second_ask_is_answered_from_the_index_without_a_build(tmp_path):
    first = profile_zoo("mlp", {"depth": 2}, 4, repeats=1, progress=False, cache_dir=tmp_path)
    assert not first.indexed and first.family == "toy" and first.config["depth"] == 2
    with mock.patch("workbench.models.zoo.build_model", side_effect=AssertionError("built")):
        again = profile_zoo("mlp", {"depth": 2}, 4, repeats=1, progress=True, cache_dir=tmp_path)  # progress: no key
    assert again.indexed and again.costs == first.costs and again.config == first.config
    assert indexed_profile("mlp", {"depth": 2}, 4, repeats=1, cache_dir=tmp_path).costs == first.costs
    # another override, batch or setting is another entry
    assert indexed_profile("mlp", {"depth": 3}, 4, repeats=1, cache_dir=tmp_path) is None
    assert indexed_profile("mlp", {"depth": 2}, 8, repeats=1, cache_dir=tmp_path) is None
    assert indexed_profile("mlp", {"depth": 2}, 4, repeats=2, cache_dir=tmp_path) is None


def test_extras_read_off_the_built_model_are_kept_with_the_profile(tmp_path):
    extras = {"layers": "builtins:len"}
    first = profile_zoo("mlp", {"depth": 2}, 4, repeats=1, progress=False, cache_dir=tmp_path, extras=extras)
    assert first.extras == {"layers": first.costs.num_layers}
    again = indexed_profile("mlp", {"depth": 2}, 4, repeats=1, cache_dir=tmp_path, extras=extras)
    assert again.indexed and again.extras == first.extras
    assert indexed_profile("mlp", {"depth": 2}, 4, repeats=1, cache_dir=tmp_path) is None  # asked without them


def test_a_damaged_or_foreign_entry_is_measured_again(tmp_path):
    profile_zoo("mlp", {}, 4, repeats=1, progress=False, cache_dir=tmp_path)
    (entry,) = (tmp_path / "zoo-index").iterdir()
    entry.write_text(entry.read_text()[:-20])
    assert indexed_profile("mlp", {}, 4, repeats=1, cache_dir=tmp_path) is None
    assert not profile_zoo("mlp", {}, 4, repeats=1, progress=False, cache_dir=tmp_path).indexed
    record = json.loads(entry.read_text())
    record["key"]["environment"]["torch"] = "0.0"  # written under another torch
    entry.write_text(json.dumps(record))
    assert indexed_profile("mlp", {}, 4, repeats=1, cache_dir=tmp_path) is None


def test_the_index_answers_only_where_the_device_is_surely_the_cpu(tmp_path, monkeypatch):
    assert index_key("mlp", {}, 4, "auto", {}) is not None or os.path.exists("/proc/driver/nvidia")
    assert index_key("mlp", {}, 4, "cuda", {}) is None
    monkeypatch.setattr(zoo_profiles, "_GPU_DRIVERS", (str(tmp_path),))  # a driver is present
    assert index_key("mlp", {}, 4, "auto", {}) is None
    assert index_key("mlp", {}, 4, "cpu", {}) is not None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # torch's thread count is part of what was measured
    assert index_key("mlp", {}, 4, "cpu", {})["cpu"][-2] == "3"


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia"), reason="on a GPU machine the device needs torch")
def test_planning_a_profiled_zoo_model_again_imports_no_torch(tmp_path):
    env = {**os.environ, "WORKBENCH_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    args = ["plan", "mlp", "--cluster", "2x8xH100-IB", "--batch", "64", "--profile-batch", "4", "--json"]
    code = ("import sys, json; from workbench.cli import main; rc = main(sys.argv[1:]); "
            "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}), file=sys.stderr)")
    runs = [subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    first, second = (json.loads(r.stderr.strip().splitlines()[-1]) for r in runs)
    assert first == {"rc": 0, "torch": True} and second == {"rc": 0, "torch": False}, runs[1].stderr[-2000:]
    assert json.loads(runs[0].stdout)["strategies"] == json.loads(runs[1].stdout)["strategies"]
