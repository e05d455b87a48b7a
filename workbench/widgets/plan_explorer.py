"""PlanExplorer: the planner's ranked strategies, why each costs what it does, and each one's timeline.

Problem. ``workbench.planning.plan`` ranks hundreds of strategies (data,
pipeline, GroPipe, asynchronous and tensor parallelism) for a model on a
cluster; a table of numbers says which is fastest but not where the time
goes, and comparing two candidates means drawing their timelines.

Approach. The explorer runs ``plan`` for the chosen cluster, global batch
and memory budget (or shows a ``PlanResult`` it is given), draws the
breakdown of the ranked plans (:func:`~workbench.viz.plan.plan_breakdown_figure`:
compute, bubble and exposed communication of the busiest rank, memory per
device against the cap) beside the ranked table, and lists the strategies
that cannot run with the reason. Clicking a bar, or choosing in the
strategy menu, selects a plan: its outline is drawn in place, its details
and launch config are shown, and its simulated timeline replaces the
previous one (closed-form estimates have none, and say so). A plan whose
layers differ (``SearchOptions(fine_grained=True)`` finds them) also shows
its per-layer strip (:func:`~workbench.viz.plan.layer_strip_figure`): a
colour per option along the layers, stage boundaries, and each stage's
memory against the budget.

Page hooks (CSS classes): ``wb-plan-button``, ``wb-strategy`` (the menu),
``wb-plan-table``, ``wb-infeasible``, ``wb-plan-detail``, ``wb-layer-strip``; the whole
explorer has ``wb-plan-explorer``.
"""

from __future__ import annotations

import html
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from ..core.costs import ModelCosts
from ..core.fields import check, check_int, number, optional
from ..planning import Budget, PlanResult, SearchOptions, TransformerShape, Workload, cluster_names, plan
from ..viz.plan import layer_strip_figure, plan_breakdown_figure, select_plan
from ..viz.timeline import timeline_figure, update_timeline_figure
from .figure import figure_widget
from .schedule_explorer import display_view, label, refresh_figure

__all__ = ["PlanExplorer"]

GIB = 2**30
_TABLE_COLUMNS = (("rank", "#", "{}"), ("name", "strategy", "{}"), ("iteration_ms", "iteration ms", "{:.3f}"),
                  ("throughput", "samples/s", "{:.1f}"), ("memory_gib", "GiB/device", "{:.3f}"),
                  ("compute_ms", "compute", "{:.3f}"), ("bubble_ms", "bubble", "{:.3f}"),
                  ("exposed_comm_ms", "exposed comm", "{:.3f}"), ("method", "method", "{}"))


class PlanExplorer:
    """Interactive view of the planner's ranking (see the module docstring).

    ``model`` is a ``ModelCosts`` profile or its JSON file; ``result`` shows
    an existing ``PlanResult`` instead of planning first. The controls set the
    cluster, the global batch, the memory cap and how many plans to show; the
    rest of the question :func:`workbench.planning.plan` is asked comes from
    ``shape`` and ``optimizer`` (the :class:`~workbench.planning.Workload`'s),
    ``world_size`` (the :class:`~workbench.planning.Budget`'s) and ``options``
    (a :class:`~workbench.planning.SearchOptions`: ``kinds``, ``recompute``,
    ``fine_grained`` ...; its ``top`` is the slider's).
    """

    def __init__(self, model: ModelCosts | str | Path, cluster: str = "8xV100-PCIe", global_batch: int = 64, *,
                 top: int = 12, memory_cap_gib: float | None = None, result: PlanResult | None = None,
                 shape: TransformerShape | None = None, optimizer: str = "adam", world_size: int | None = None,
                 options: SearchOptions | None = None):
        if not isinstance(model, ModelCosts):
            if not Path(str(model)).is_file():
                raise ValueError(f"PlanExplorer model must be a ModelCosts or a ModelCosts JSON file, got {model!r}")
            model = ModelCosts.load(model)
        if cluster not in cluster_names():
            raise ValueError(f"PlanExplorer cluster must be one of {', '.join(cluster_names())}; got {cluster!r}")
        check_int("PlanExplorer global_batch", global_batch, 1)
        check_int("PlanExplorer top", top, 1, 50)
        check("PlanExplorer memory_cap_gib", memory_cap_gib, optional(number(0, strict=True)))
        if options is not None and not isinstance(options, SearchOptions):
            raise ValueError(f"PlanExplorer options must be a SearchOptions or None, got {options!r}")
        self.costs = model
        self.shape, self.optimizer, self.world_size = shape, optimizer, world_size
        self.options = options or SearchOptions()
        style = {"description_width": "initial"}
        self.cluster = W.Dropdown(options=cluster_names(), value=cluster, description="cluster")
        self.global_batch = W.BoundedIntText(value=global_batch, min=1, max=1 << 20, description="global batch",
                                             style=style)
        self.memory_cap = W.BoundedFloatText(value=memory_cap_gib or 0.0, min=0.0, max=1e4,
                                             description="memory cap GiB (0: device)", style=style)
        self.top = W.IntSlider(value=top, min=1, max=50, description="show top")
        self.plan_button = W.Button(description="Plan", button_style="primary", icon="search")
        self.plan_button.add_class("wb-plan-button")
        # how far the search has got: interrupting the kernel ends it with the best plans so far
        self.progress = W.IntProgress(value=0, min=0, max=1, description="", bar_style="info",
                                      layout=W.Layout(visibility="hidden"))
        self.progress.add_class("wb-plan-progress")
        self.strategy = W.Dropdown(options=[], description="strategy")
        self.strategy.add_class("wb-strategy")
        self.table = label("wb-plan-table")
        self.infeasible = label("wb-infeasible")
        self.detail = label("wb-plan-detail")
        self.error = label("wb-error")
        self.result: PlanResult | None = None
        self.breakdown_fig: go.FigureWidget | None = None
        self.timeline_fig: go.FigureWidget | None = None
        self.figure_box = W.VBox()
        self.timeline_box = W.VBox()
        self.strip_box = W.VBox()
        self.strip_box.add_class("wb-layer-strip")
        self.plan_button.on_click(lambda _b: self.replan())
        self._listing = False
        self.strategy.observe(lambda change: self._listing or self._show_selected(), names="value")
        self.widget = W.VBox([
            W.HBox([self.cluster, self.global_batch]), W.HBox([self.memory_cap, self.top, self.plan_button, self.progress]),
            self.error, self.figure_box, self.table, self.strategy, self.detail, self.strip_box, self.timeline_box,
            self.infeasible,
        ])
        self.widget.add_class("wb-plan-explorer")
        if result is not None:
            self.show(result)
        else:
            self.replan()

    # -- planning ----------------------------------------------------------------------------------
    def replan(self) -> PlanResult | None:
        """Run the planner with the controls' values and show its ranking."""
        cap = self.memory_cap.value or None
        self.plan_button.disabled = True
        self.progress.layout.visibility = "visible"
        try:
            result = plan(Workload(self.costs, self.global_batch.value, shape=self.shape, optimizer=self.optimizer),
                          self.cluster.value, Budget(memory_cap_gib=cap, world_size=self.world_size),
                          replace(self.options, top=self.top.value), progress=self._advance)
        except ValueError as error:
            self.error.value = f"<span style='color:#d62728'>{html.escape(str(error))}</span>"
            return None
        finally:  # the bar goes before the button comes back: never a pressable Plan beside a running bar
            self.progress.layout.visibility = "hidden"
            self.plan_button.disabled = False
        self.error.value = "" if not result.interrupted else \
            f"<span style='color:#ff7f0e'>{html.escape(result.notes[0])}</span>"
        self.show(result)
        return result

    def _advance(self, phase: str, done: int, total: int) -> None:
        """The planner's progress callback: the bar shows the phase and how many of its items are done (redrawn
        about a hundred times a phase at most)."""
        if done == 0:
            self.progress.value, self.progress.max = 0, max(total, 1)
        elif done < total and done % max(1, total // 100):
            return
        self.progress.description = f"{phase} {done}/{total}"
        self.progress.value = done

    @property
    def memory_cap_gib(self) -> float | None:
        if self.memory_cap.value:
            return self.memory_cap.value
        return self.result.cluster.device.memory_bytes / GIB if self.result else None

    def show(self, result: PlanResult) -> None:
        """Display ``result``: breakdown, table, infeasible strategies; select its best plan."""
        self.result = result
        rows = [r for r in result.rows() if r["feasible"]]
        fresh = plan_breakdown_figure(rows, selected=result.best.name, memory_cap_gib=self.memory_cap_gib,
                                      title=f"{self.costs.model} on {result.cluster.name}, global batch "
                                            f"{result.global_batch}: {len(result.plans)} plans of {result.searched}")
        if self.breakdown_fig is None:
            self.breakdown_fig = figure_widget(fresh)
            self.figure_box.children = [self.breakdown_fig]
        else:
            refresh_figure(self.breakdown_fig, lambda fig: False, lambda: fresh)
        for trace in self.breakdown_fig.data:
            trace.on_click(self._on_bar_click)
        self.table.value = self._table_html(rows)
        self.infeasible.value = self._infeasible_html(result.infeasible)
        names = [p.name for p in result.plans]
        self._listing = True  # new options select their first entry: show the plan once, below
        try:
            self.strategy.options = names
            self.strategy.value = result.best.name
        finally:
            self._listing = False
        self._show_selected()

    # -- selection ---------------------------------------------------------------------------------
    @property
    def selected(self):
        """The selected :class:`~workbench.planning.RankedPlan`."""
        return self.result[self.strategy.value] if self.result and self.strategy.value else None

    def select(self, name: str) -> None:
        names = list(self.strategy.options)
        if name not in names:
            raise ValueError(f"no ranked plan named {name!r}; ranked: {', '.join(names)}")
        self.strategy.value = name

    def _on_bar_click(self, trace, points, _state=None) -> None:
        if points.point_inds:
            self.select(trace.y[points.point_inds[0]])

    def _show_selected(self) -> None:
        chosen = self.selected
        if chosen is None:
            return
        with self.breakdown_fig.batch_update():
            select_plan(self.breakdown_fig, chosen.name)
        self.detail.value = self._detail_html(chosen)
        strip = self._strip_figure(chosen)
        self.strip_box.children = [figure_widget(strip)] if strip is not None else []
        timeline = chosen.timeline()
        if timeline is None:
            self.timeline_box.children = [W.HTML(f"<i>{html.escape(chosen.name)} is estimated in closed form "
                                                 f"({chosen.estimate.method}); it has no simulated timeline</i>")]
            return
        title = f"{chosen.name}: simulated on {self.result.cluster.name}"
        if self.timeline_fig is None:
            self.timeline_fig = figure_widget(timeline_figure(timeline, title=title))
        else:
            refresh_figure(self.timeline_fig, lambda fig: update_timeline_figure(fig, timeline),
                           lambda: timeline_figure(timeline, title=title), title=title)
        self.timeline_box.children = [self.timeline_fig]

    def _strip_figure(self, chosen) -> go.Figure | None:
        """The per-layer strip of a plan whose layers differ (or that the per-layer search costed); else None."""
        detail = chosen.estimate.detail
        if chosen.plan.is_uniform and "stage_memory_gib" not in detail:
            return None
        cap = self.memory_cap_gib
        return layer_strip_figure(chosen.layers(), stage_memory_gib=detail.get("stage_memory_gib"), budget_gib=cap,
                                  title=f"{chosen.name[:80]}: options per layer")

    # -- html ----------------------------------------------------------------------------------------
    def _table_html(self, rows: list[dict[str, Any]]) -> str:
        head = "".join(f"<th>{title}</th>" for _, title, _ in _TABLE_COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt.format(row[key]))}</td>"
                                        for key, _, fmt in _TABLE_COLUMNS) + "</tr>" for row in rows)
        return f"<table><tr>{head}</tr>{body}</table>"

    @staticmethod
    def _infeasible_html(infeasible: list[dict[str, Any]], limit: int = 12) -> str:
        if not infeasible:
            return "every strategy searched fits"
        items = "".join(f"<li><code>{html.escape(i['name'])}</code>: {html.escape(i['reason'])}</li>"
                        for i in infeasible[:limit])
        more = f"<li>... and {len(infeasible) - limit} more</li>" if len(infeasible) > limit else ""
        return f"<details><summary>{len(infeasible)} strategies cannot run</summary><ul>{items}{more}</ul></details>"

    @staticmethod
    def _detail_html(chosen) -> str:
        e = chosen.estimate
        try:
            config = chosen.to_config()
            config = html.escape(json.dumps({"model": config.model.name, "plan": config.plan.to_dict(),
                                             "training": {"global_batch": config.training.global_batch}}))
        except ValueError as error:
            config = html.escape(f"not launchable: {error}")
        return (f"<b>#{chosen.rank} {html.escape(chosen.name)}</b>: iteration <b>{e.iteration_ms:.3f} ms</b> = "
                f"compute {e.compute_ms:.3f} + bubble {e.bubble_ms:.3f} + exposed communication "
                f"{e.exposed_comm_ms:.3f} ms; {e.throughput:.1f} samples/s; {e.memory_gib:.3f} GiB per device; "
                f"{e.method}" + (f"; partition <code>{e.partition}</code>" if e.partition else "") +
                f"<br>launch config: <code>{config}</code>")

    # -- display ---------------------------------------------------------------------------------------
    def figures(self) -> list[go.Figure]:
        """The breakdown and the selected plan's timeline as static figures."""
        if self.result is None:
            return []
        rows = [r for r in self.result.rows() if r["feasible"]]
        out = [plan_breakdown_figure(rows, selected=self.strategy.value, memory_cap_gib=self.memory_cap_gib)]
        strip = self._strip_figure(self.selected) if self.selected else None
        if strip is not None:
            out.append(strip)
        timeline = self.selected.timeline() if self.selected else None
        if timeline is not None:
            out.append(timeline_figure(timeline, title=f"{self.strategy.value} (simulated)"))
        return out

    def summary(self) -> str:
        return f"{self.error.value}{self.table.value}{self.detail.value}"

    def _ipython_display_(self) -> None:
        display_view(self.widget, self.figures, self.summary)
