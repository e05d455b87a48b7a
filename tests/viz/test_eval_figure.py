"""The validation chart: metric and loss against wall time, the target as a line, always the same three traces."""

import numpy as np

from workbench.viz.job_figures import EVAL_TRACES, eval_figure, eval_metric, job_summary_figure
from workbench.viz.style import EVAL_COLORS

EVALS = {"step": np.array([2.0, 4.0, 6.0]), "wall_s": np.array([1.0, 2.5, 4.0]),
         "accuracy": np.array([0.4, 0.6, 0.8]), "val_loss": np.array([1.5, 1.0, 0.6]),
         "perplexity": np.full(3, np.nan)}


def test_metric_and_loss_against_wall_time_with_the_target_across_the_span():
    fig = eval_figure(EVALS, metric="accuracy", target=0.75)
    assert len(fig.data) == len(EVAL_TRACES)
    metric, loss, target = fig.data
    assert list(metric.x) == [1.0, 2.5, 4.0] and list(metric.y) == [0.4, 0.6, 0.8]
    assert list(loss.y) == [1.5, 1.0, 0.6] and loss.yaxis == "y2" and fig.layout.yaxis2.overlaying == "y"
    assert list(target.x) == [0.0, 4.0] and list(target.y) == [0.75, 0.75] and target.line.dash == "dash"
    assert (metric.line.color, loss.line.color, target.line.color) == (
        EVAL_COLORS["metric"], EVAL_COLORS["val_loss"], EVAL_COLORS["target"])
    assert fig.layout.xaxis.title.text == "wall s" and fig.layout.yaxis.title.text == "accuracy"


def test_empty_and_untargeted_charts_keep_their_traces():
    fig = eval_figure({}, metric="accuracy")
    assert [len(t.x) for t in fig.data] == [0, 0, 0]
    assert len(eval_figure(EVALS, metric="accuracy").data[2].x) == 0  # no target, no line


def test_language_models_show_perplexity():
    lm = dict(EVALS, perplexity=np.array([80.0, 40.0, 20.0]))
    assert eval_metric(lm) == "perplexity" and eval_metric(EVALS) == "accuracy"
    assert eval_metric(lm, {"accuracy": 0.5}) == "accuracy" and eval_metric({}, {"perplexity": 30.0}) == "perplexity"


def test_summary_adds_the_validation_row_only_for_runs_that_evaluate():
    metrics = {0: {"step": np.arange(3.0), "loss": np.ones(3), "samples_per_s": np.ones(3), "restart": np.zeros(3)}}
    plain = job_summary_figure({"metrics": metrics})
    assert not any(t.name.startswith("val ") for t in plain.data) and "yaxis4" not in plain.layout
    summary = job_summary_figure({"metrics": metrics, "evals": EVALS, "targets": {"accuracy": 0.7}})
    by_name = {t.name: t for t in summary.data}
    assert list(by_name["val accuracy"].y) == [0.4, 0.6, 0.8] and list(by_name["target accuracy"].y) == [0.7, 0.7]
    assert by_name["val accuracy"].yaxis == "y4" and by_name["val loss"].yaxis == "y5"
