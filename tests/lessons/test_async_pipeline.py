"""Lesson 05's helpers: the weight versions a run recorded, and the words and figure about its runs."""

from __future__ import annotations

from workbench.core.timeline import Event, Timeline
from workbench.lessons import async_pipeline
from workbench.lessons.async_pipeline import speedup_figure, speedup_text, stash_cost_text, weight_versions


def test_weight_versions_pair_each_forward_with_its_backward(monkeypatch, tmp_path):
    events = [Event(0, 0, "F", 0.0, 1.0, microbatch=0, iteration=0, version=0, source="measured"),
              Event(0, 0, "STEP", 1.0, 1.5, iteration=0, source="measured"),
              Event(0, 0, "B", 2.0, 3.0, microbatch=0, iteration=0, version=1, source="measured"),
              Event(1, 1, "F", 1.0, 2.0, microbatch=0, iteration=0, version=0, source="measured"),
              Event(1, 1, "B", 2.0, 3.0, microbatch=0, iteration=0, version=0, source="measured")]
    seen = []
    monkeypatch.setattr(async_pipeline, "load_measured_timeline", lambda run_dir: seen.append(run_dir) or
                        Timeline(events))
    used = weight_versions(tmp_path)
    assert seen == [tmp_path]
    assert used == {(0, 0, 0): {"F": 0, "B": 1}, (1, 0, 0): {"F": 0, "B": 0}}
    assert sum(v["F"] != v["B"] for v in used.values()) == 1


def test_the_stash_cost_is_said_only_when_both_runs_reached_the_target():
    sync = {"reached": True, "step": 20, "train_s": 2.0}
    stashed = {"reached": True, "step": 30, "train_s": 5.0}
    assert stash_cost_text(sync, stashed) == (" The stashed asynchronous run needed 1.5x the steps of the synchronous "
                                              "one and 2.5x its training seconds.")
    assert stash_cost_text(sync, {"reached": False}) == ""
    assert stash_cost_text({"reached": False}, stashed) == ""


def test_the_speedup_words_and_figure_follow_the_measurements():
    ideal = {"naive": 1.0, "1F1B": 1.6, "async": 2.0}
    speedup = {"naive": 1.0, "1F1B": 1.2, "async": 1.5}
    text = speedup_text(40.0, speedup, ideal)
    assert text.startswith("Measured on this machine: naive model parallelism trained **40.0 samples/s**, 1F1B "
                           "**1.20x** that (ideal 1.60x) and the asynchronous pipeline **1.50x** (ideal 2x). ")
    assert "The asynchronous pipeline, which never flushes, gained the most." in text
    assert text.endswith("1F1B reached 75% of its ideal and the asynchronous pipeline 75% of its own.")
    assert "1F1B gained more than the asynchronous pipeline in this run." in speedup_text(
        40.0, {**speedup, "async": 1.1}, ideal)
    fig = speedup_figure(speedup, ideal, "title")
    assert [t.name for t in fig.data] == ["measured", "ideal (no cost for smaller micro-batches)"]
    assert list(fig.data[0].y) == [1.0, 1.2, 1.5] and list(fig.data[0].text) == ["1.00x", "1.20x", "1.50x"]
    assert list(fig.data[1].y) == [1.0, 1.6, 2.0] and fig.layout.barmode == "group"
