"""ScheduleExplorer: a pipeline schedule to play with, for teaching bubbles.

Problem. The bubble formulas, ``(p - 1) / (m + p - 1)`` for GPipe and 1F1B,
``(p - 1) / (v m + p - 1)`` for interleaved 1F1B and their zero-bubble
successors' (each kind's spec states its own), are exact only for
identical stages and free communication; students believe them when they
see the simulated timeline agree, and understand them when they see where
the idle time sits and how it moves as stages, micro-batches, chunks,
backward cost and communication change.

Approach. The controls build one schedule value with the same generators
the runtime executes (the controls' :class:`~workbench.core.plan.ParallelPlan`
and ``scheduling.registry.schedule_for``), cost it with identical stages
(forward 1 unit, backward ``backward ratio`` units, per rank, half input and
half weight gradient where a kind splits it), and, when the communication
ratio is above zero, a one-link cluster whose transfer of one activation
takes ``comm ratio`` forward units (gradient all-reduces use the same link).
The simulated bubble is shown beside the formula; the time-slot control
steps through the run one compute start at a time, drawing a line on the
timeline and listing what every rank does at that moment. "compare with"
draws a second schedule with the same parameters side by side.

Page hooks (CSS classes): ``wb-formula``, ``wb-simulated-bubble``,
``wb-slot`` (the slot slider), ``wb-slot-grid`` (what each rank runs);
the whole explorer has ``wb-schedule-explorer``.

This module also holds the small helpers every widget here shares
(:func:`label`, :func:`refresh_figure`, :func:`display_view`).
"""

from __future__ import annotations

import html
import os
from dataclasses import fields
from typing import Callable

import ipywidgets as W
import plotly.graph_objects as go

from ..core.costs import ClusterSpec, LinkSpec
from ..core.fields import check_int, check_number
from ..core.ir import Schedule
from ..core.timeline import Timeline
from ..planning.costs.clusters import get_device
from ..core.plan import PIPELINE_KINDS, ParallelPlan
from ..scheduling.registry import schedule_for
from ..scheduling.simulate import SimResult, simulate
from ..scheduling.stagecosts import StageCosts
from ..viz.timeline import timeline_figure, update_timeline_figure
from .figure import figure_widget

__all__ = ["ScheduleExplorer", "EXPLORER_SCHEDULES", "bubble_formula", "build_schedule", "uniform_stage_costs",
           "label", "refresh_figure", "display_view"]

# every registered kind the workbench's interpreter runs (torch's own schedules are drawn by their namesakes)
EXPLORER_SCHEDULES = tuple(k for k, cls in PIPELINE_KINDS.items() if cls.runtime in ("pipeline", "grouped", "async"))
MESSAGE_BYTES = 1 << 20  # one activation message of the explorer's synthetic model
_COMPUTE = ("F", "B", "I", "W")


# -- helpers shared by the widgets ------------------------------------------------------------------
def label(css_class: str) -> W.HTML:
    """An HTML value label carrying ``css_class`` (the hook notebooks and browser tests find it by)."""
    widget = W.HTML(value="")
    widget.add_class(css_class)
    return widget


def refresh_figure(widget: go.FigureWidget, update: Callable[[go.Figure], bool], rebuild: Callable[[], go.Figure],
                   *, title: str | None = None) -> None:
    """Update ``widget`` in place in one ``batch_update``; draw it anew only when ``update`` cannot."""
    with widget.batch_update():
        if update(widget):
            if title is not None:
                widget.layout.title.text = title
            return
        fresh = rebuild()
        widget.data = ()
        widget.add_traces(list(fresh.data))
        widget.layout = fresh.layout


def display_view(widget: W.Widget, figures: Callable[[], list[go.Figure]], summary: Callable[[], str]) -> None:
    """Show the live widget, or its summary and static figures where no widget frontend is attached."""
    from IPython.display import HTML, display

    from .job_monitor import ui_mode

    if ui_mode() == "widget":
        display(widget)
        return
    display(HTML(summary()))
    renderer = os.environ.get("WORKBENCH_PLOTLY_RENDERER", "plotly_mimetype+notebook_connected")
    for fig in figures():
        fig.show(renderer=renderer)


# -- schedule, costs and formula ---------------------------------------------------------------------
def build_schedule(kind: str, stages: int, microbatches: int, *, chunks: int = 2, groups: int = 2, delay: int = 0,
                   iterations: int = 2) -> Schedule:
    """The compute schedule the explorer shows (the generators' own value)."""
    if kind not in EXPLORER_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(EXPLORER_SCHEDULES)}; got {kind!r}")
    plan = ParallelPlan.for_pipeline(kind, stages, microbatches, chunks=chunks, delay=delay, groups=groups)
    return schedule_for(plan, num_iterations=iterations if plan.iterates_across_steps else 1)


def bubble_formula(kind: str, stages: int, microbatches: int, *, chunks: int = 2, iterations: int = 2,
                   backward_ratio: float = 2.0) -> tuple[float, str] | None:
    """The textbook bubble fraction for identical stages and free communication, with its formula, as the
    kind's spec states it (``PipelineSpec.uniform_bubble``); None for a kind without one (``zb-auto``)."""
    if kind not in EXPLORER_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(EXPLORER_SCHEDULES)}; got {kind!r}")
    plan = ParallelPlan.for_pipeline(kind, max(stages, PIPELINE_KINDS[kind].min_stages), microbatches,
                                     chunks=chunks, groups=2)
    return plan.pipeline.uniform_bubble(stages, microbatches, backward_ratio, iterations)


def uniform_stage_costs(schedule: Schedule, *, backward_ratio: float = 2.0,
                        comm_ratio: float = 0.0) -> tuple[StageCosts, ClusterSpec | None]:
    """Identical (virtual) stages, forward 1 and backward ``backward_ratio`` per rank, and the link for ``comm_ratio``.

    Interleaved ranks split their unit over their chunks. With
    ``comm_ratio > 0`` every stage sends :data:`MESSAGE_BYTES` over a link
    that takes ``comm_ratio`` forward units per message, and all-reduces as
    many gradient bytes over the same link.
    """
    for name, value in (("backward_ratio", backward_ratio), ("comm_ratio", comm_ratio)):
        check_number(name, value, 0)
    chunks = schedule.meta.chunks
    forward = 1.0 / chunks
    nbytes = MESSAGE_BYTES if comm_ratio > 0 else 0
    costs = StageCosts.uniform(schedule.num_stages, forward_ms=forward, backward_ms=backward_ratio * forward,
                               send_bytes=nbytes, param_bytes=nbytes)
    if comm_ratio == 0:
        return costs, None
    link = LinkSpec("explorer-link", 0.0, nbytes / (comm_ratio * forward * 1e-3) / 1e9)
    return costs, ClusterSpec("explorer", 1, schedule.num_ranks, get_device("cpu-2core"), link)


def time_slots(timeline: Timeline) -> list[float]:
    """The distinct start times of compute actions: the moments the explorer steps through."""
    return sorted({round(e.start, 9) for e in timeline if e.op in _COMPUTE})


def running_at(timeline: Timeline, t: float) -> dict[int, str]:
    """What each rank computes at time ``t`` (its action's text form, or "idle")."""
    out = {r: "idle" for r in timeline.ranks}
    for e in timeline:
        if e.op in _COMPUTE and e.start <= t + 1e-9 < e.end:
            out[e.rank] = e.label
    return out


class ScheduleExplorer:
    """Interactive schedule lesson (see the module docstring)."""

    def __init__(self, schedule: str = "1f1b", *, stages: int = 4, microbatches: int = 8, chunks: int = 2,
                 groups: int = 2, delay: int = 0, iterations: int = 2, backward_ratio: float = 2.0,
                 comm_ratio: float = 0.0, compare: str | None = None):
        if schedule not in EXPLORER_SCHEDULES:
            raise ValueError(f"ScheduleExplorer schedule must be one of {', '.join(EXPLORER_SCHEDULES)}; "
                             f"got {schedule!r}")
        if compare is not None and compare not in EXPLORER_SCHEDULES:
            raise ValueError(f"ScheduleExplorer compare must be None or one of {', '.join(EXPLORER_SCHEDULES)}; "
                             f"got {compare!r}")
        for name, value, top in (("stages", stages, 16), ("microbatches", microbatches, 64), ("chunks", chunks, 4),
                                 ("groups", groups, 4), ("iterations", iterations, 4)):
            check_int(f"ScheduleExplorer {name}", value, 1, top)
        if delay not in (0, 1):
            raise ValueError(f"ScheduleExplorer delay must be 0 or 1, got {delay!r}")
        for name, value, top in (("backward_ratio", backward_ratio, 4.0), ("comm_ratio", comm_ratio, 2.0)):
            check_number(f"ScheduleExplorer {name}", value, 0, top)
        self.schedule = W.Dropdown(options=list(EXPLORER_SCHEDULES), value=schedule, description="schedule")
        self.compare = W.Dropdown(options=["none", *EXPLORER_SCHEDULES], value=compare or "none",
                                  description="compare with")
        self.stages = W.IntSlider(value=stages, min=1, max=16, description="stages p")
        self.microbatches = W.IntSlider(value=microbatches, min=1, max=64, description="micro-batches m")
        self.chunks = W.IntSlider(value=chunks, min=1, max=4, description="chunks v")
        self.groups = W.IntSlider(value=groups, min=1, max=4, description="groups")
        self.delay = W.Dropdown(options=[0, 1], value=delay, description="delay")
        self.iterations = W.IntSlider(value=iterations, min=1, max=4, description="iterations n")
        self.backward_ratio = W.FloatSlider(value=backward_ratio, min=0.0, max=4.0, step=0.25,
                                            description="backward / forward")
        self.comm_ratio = W.FloatSlider(value=comm_ratio, min=0.0, max=2.0, step=0.05,
                                        description="transfer / forward")
        for control in (self.backward_ratio, self.comm_ratio):
            control.style = {"description_width": "initial"}
        self.slot = W.IntSlider(value=0, min=0, max=0, description="time slot")
        self.slot.add_class("wb-slot")
        self.play = W.Play(value=0, min=0, max=0, interval=400, description="play")
        W.jslink((self.play, "value"), (self.slot, "value"))
        self.formula = label("wb-formula")
        self.simulated_bubble = label("wb-simulated-bubble")
        self.slot_grid = label("wb-slot-grid")
        self.error = label("wb-error")
        self.result: SimResult | None = None
        self.other: SimResult | None = None
        self.slots: list[float] = []
        self.figure_widget: go.FigureWidget | None = None
        self.figure_box = W.VBox()
        self.refresh()
        for control in (self.schedule, self.compare, self.stages, self.microbatches, self.chunks, self.groups,
                        self.delay, self.iterations, self.backward_ratio, self.comm_ratio):
            control.observe(lambda _change: self.refresh(), names="value")
        self.slot.observe(lambda _change: self._show_slot(), names="value")
        self.widget = W.VBox([
            W.HBox([self.schedule, self.compare]),
            W.HBox([self.stages, self.microbatches, self.chunks]),
            W.HBox([self.groups, self.delay, self.iterations]),
            W.HBox([self.backward_ratio, self.comm_ratio]),
            W.HBox([self.formula, self.simulated_bubble], layout=W.Layout(justify_content="space-between")),
            self.error, self.figure_box, W.HBox([self.play, self.slot]), self.slot_grid,
        ])
        self.widget.add_class("wb-schedule-explorer")

    # -- model ------------------------------------------------------------------------------------
    def _simulate(self, kind: str) -> SimResult:
        schedule = build_schedule(kind, self.stages.value, self.microbatches.value, chunks=self.chunks.value,
                                  groups=self.groups.value, delay=self.delay.value, iterations=self.iterations.value)
        costs, cluster = uniform_stage_costs(schedule, backward_ratio=self.backward_ratio.value,
                                             comm_ratio=self.comm_ratio.value)
        return simulate(schedule, costs, cluster)

    @staticmethod
    def simulated_bubble_fraction(result: SimResult) -> float:
        """Mean over ranks of the simulated bubble fraction."""
        values = result.metrics["bubble_fraction"]
        return sum(values) / len(values)

    def formula_value(self, kind: str | None = None) -> tuple[float, str] | None:
        return bubble_formula(kind or self.schedule.value, self.stages.value, self.microbatches.value,
                              chunks=self.chunks.value, iterations=self.iterations.value,
                              backward_ratio=self.backward_ratio.value)

    def refresh(self) -> None:
        """Rebuild, re-simulate and redraw from the controls (each enabled where a chosen kind has that field)."""
        chosen = [PIPELINE_KINDS[k] for k in (self.schedule.value, self.compare.value) if k in EXPLORER_SCHEDULES]
        has = {f.name for cls in chosen for f in fields(cls)}
        self.chunks.disabled = "chunks" not in has
        self.delay.disabled = "delay" not in has
        self.groups.disabled = not any(cls.replicated for cls in chosen)
        self.iterations.disabled = not any(cls.streams_iterations for cls in chosen)
        try:
            self.result = self._simulate(self.schedule.value)
            self.other = None if self.compare.value == "none" else self._simulate(self.compare.value)
        except ValueError as error:
            self.error.value = f"<span style='color:#d62728'>{html.escape(str(error))}</span>"
            return
        self.error.value = ""
        self._update_labels()
        self._update_figure()
        self.slots = time_slots(self.result.timeline)
        with self.slot.hold_trait_notifications():
            self.slot.max = self.play.max = max(0, len(self.slots) - 1)
            self.slot.value = min(self.slot.value, self.slot.max)
        self._show_slot()

    def _bubble_text(self, kind: str, result: SimResult) -> tuple[str, str]:
        formula = self.formula_value(kind)
        assumption = "" if self.comm_ratio.value == 0 else " (assumes free communication)"
        if formula is None:
            stated = f"{kind}: no closed form (built from the stages' times)"
        else:
            value, text = formula
            stated = f"{kind} formula bubble {text} = <b>{100 * value:.1f}%</b>{assumption}"
        return (stated,
                f"{kind} simulated bubble <b>{100 * self.simulated_bubble_fraction(result):.1f}%</b>, "
                f"iteration {result.metrics['iteration_ms']:.2f} units")

    def _update_labels(self) -> None:
        pairs = [self._bubble_text(self.schedule.value, self.result)]
        if self.other is not None:
            pairs.append(self._bubble_text(self.compare.value, self.other))
        self.formula.value = "<br>".join(f for f, _ in pairs)
        self.simulated_bubble.value = "<br>".join(s for _, s in pairs)

    def figure(self) -> go.Figure:
        """The current timeline (two side by side when comparing) as a static figure."""
        title = f"{self.schedule.value}: p={self.stages.value}, m={self.microbatches.value}"
        if self.other is None:
            return timeline_figure(self.result.timeline, title=title)
        return timeline_figure([self.result.timeline, self.other.timeline], compare="side",
                               names=[self.schedule.value, self.compare.value], title=title)

    def _update_figure(self) -> None:
        if self.figure_widget is None:
            self.figure_widget = figure_widget(self.figure())
            self.figure_box.children = [self.figure_widget]
            return
        title = f"{self.schedule.value}: p={self.stages.value}, m={self.microbatches.value}"
        refresh_figure(self.figure_widget,
                       lambda fig: self.other is None and update_timeline_figure(fig, self.result.timeline),
                       self.figure, title=title)

    # -- stepping -----------------------------------------------------------------------------------
    def slot_actions(self, slot: int | None = None) -> dict[int, str]:
        """What each rank computes at time slot ``slot`` (default: the slider's)."""
        index = self.slot.value if slot is None else slot
        if not 0 <= index < len(self.slots):
            raise ValueError(f"slot must be from 0 to {len(self.slots) - 1}, got {index!r}")
        return running_at(self.result.timeline, self.slots[index])

    def step(self, delta: int = 1) -> None:
        """Move the time-slot control by ``delta`` (clamped to the run)."""
        self.slot.value = min(max(self.slot.value + delta, 0), self.slot.max)

    def _show_slot(self) -> None:
        if not self.slots:
            return
        t = self.slots[self.slot.value]
        actions = self.slot_actions()
        cells = "".join(f"<tr><td>rank {r}</td><td><code>{a}</code></td></tr>" for r, a in sorted(actions.items()))
        busy = sum(a != "idle" for a in actions.values())
        self.slot_grid.value = (f"<b>t = {t:.2f}</b> (slot {self.slot.value + 1} of {len(self.slots)}): "
                                f"{busy} of {len(actions)} ranks busy<table>{cells}</table>")
        if self.figure_widget is not None:
            self.figure_widget.layout.shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": t, "x1": t,
                                                 "y0": 0, "y1": 1, "line": {"color": "black", "dash": "dot"}}]

    # -- display ------------------------------------------------------------------------------------
    def summary(self) -> str:
        return f"{self.formula.value}<br>{self.simulated_bubble.value}"

    def _ipython_display_(self) -> None:
        display_view(self.widget, lambda: [self.figure()], self.summary)

    def __repr__(self) -> str:
        return f"ScheduleExplorer({self.schedule.value}, p={self.stages.value}, m={self.microbatches.value})"
