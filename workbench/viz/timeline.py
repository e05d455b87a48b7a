"""The pipeline timeline (Gantt chart): what every rank did, when, and where it idled.

Problem. Every view of a run (the schedule lessons, the partition editor,
the planner, the job monitor and its static summary) shows a timeline, and
the workbench's signature view puts the simulator's prediction over the
measured run. Drawn by several functions, the same run looked different in
each and even listed its ranks in different orders.

Approach. One drawing function (:func:`add_timeline`, which
:func:`timeline_figure` wraps) turns core ``Timeline`` values (or anything
with a ``.timeline``) into bars, whatever their source. One horizontal lane
per rank for compute, plus a lane under it for the rank's communication
(sends and all-reduces run beside compute, so they get their own row);
lanes run top to bottom from rank 0. Bars are coloured by op category
(:mod:`workbench.viz.style`) and labelled with the micro-batch (``3``;
``3/i1`` in iteration 1; and the weight version, ``3/i1 v0``, where the
schedule sets one); gaps between compute bars are drawn as pale "idle" bars
so the bubble is visible. Several timelines (say simulated and measured) are
either overlaid on the same lanes (each lane split in thin rows, one per
run, the first on top and the later ones translucent) or stacked side by
side on a shared time axis.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core.timeline import Timeline
from .style import CATEGORY_COLORS, CATEGORY_ORDER, IDLE, MEASURED_OPACITY, apply_layout, category_of

__all__ = ["timeline_figure", "add_timeline", "idle_gaps", "timeline_rows", "update_timeline_figure", "timeline_slots",
           "update_timeline_slots"]

_COMPUTE = {"F", "B", "I", "W"}
_COMM_CATEGORIES = {"send/recv", "all-reduce"}  # drawn on the rank's communication lane
_LANE_PX = 28
_MAX_LABELS = 800
_HOVER = "%{hovertext}<br>%{customdata:.3f} ms + %{x:.3f} ms<extra></extra>"  # customdata: the start


def _as_timelines(value: Any) -> list[Timeline]:
    items = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for i, item in enumerate(items):
        item = getattr(item, "timeline", item)
        if not isinstance(item, Timeline):
            raise ValueError(f"timeline_figure needs Timelines (or results with .timeline); item {i} is "
                             f"{type(item).__name__}")
        out.append(item)
    if not out:
        raise ValueError("timeline_figure needs at least one Timeline, got none")
    return out


def _gaps(spans: list[tuple[float, float]], first: float, last: float) -> list[tuple[float, float]]:
    gaps, cursor = [], first
    for start, end in sorted(spans):
        if start > cursor + 1e-9:
            gaps.append((cursor, start))
        cursor = max(cursor, end)
    if last > cursor + 1e-9:
        gaps.append((cursor, last))
    return gaps


def idle_gaps(timeline: Timeline, rank: int) -> list[tuple[float, float]]:
    """Intervals in ``[timeline.start, timeline.end]`` when ``rank`` runs no compute."""
    spans = [(e.start, e.end) for e in timeline.on_rank(rank) if e.op in _COMPUTE]
    return _gaps(spans, timeline.start, timeline.end)


def _lane(e) -> str:
    return f"rank {e.rank} comm" if category_of(e.op) in _COMM_CATEGORIES else f"rank {e.rank}"


def _label(e) -> str:
    if e.op in ("SEND_F", "SEND_B"):
        return f"{e.microbatch}>{e.peer}"
    if e.op in ("RECV_F", "RECV_B"):
        return f"{e.microbatch}<{e.peer}"
    if e.op in ("AR", "STEP"):
        return e.op if e.iteration == 0 else f"{e.op} i{e.iteration}"
    text = "" if e.microbatch is None else str(e.microbatch)
    if e.iteration:
        text += f"/i{e.iteration}"
    return text + (f" v{e.version}" if e.version is not None else "")


def timeline_rows(timeline: Timeline, name: str = "simulated", *, show_idle: bool = True) -> dict[str, dict[str, list]]:
    """The bars of one timeline grouped by colour category, in :data:`CATEGORY_ORDER`.

    Per category: ``y`` (lane), ``base`` (start), ``x`` (duration), ``text``
    (label) and ``hover`` (what the bar is; the hover template adds its
    times): the data one bar trace draws. One pass over the events; the
    hover text does not hold times, so the same schedule timed differently
    changes only ``base`` and ``x``.
    """
    rows: dict[str, dict[str, list]] = {}
    compute_spans: dict[int, list[tuple[float, float]]] = {}

    def add(category: str, lane: str, start: float, end: float, text: str, hover: str) -> None:
        row = rows.get(category)
        if row is None:
            row = rows[category] = {"y": [], "base": [], "x": [], "text": [], "hover": []}
        row["y"].append(lane)
        row["base"].append(start)
        row["x"].append(end - start)
        row["text"].append(text)
        row["hover"].append(hover)

    for e in timeline.events:
        if e.op in _COMPUTE:
            compute_spans.setdefault(e.rank, []).append((e.start, e.end))
        if e.end <= e.start:
            continue
        hover = (f"{name}: rank {e.rank} {e.label} ({e.op}) stage {e.stage}" +
                 (f"<br>{e.nbytes} bytes" if e.nbytes else ""))
        add(category_of(e.op), _lane(e), e.start, e.end, _label(e), hover)
    if show_idle and timeline.events:
        first, last = timeline.start, timeline.end
        for r in timeline.ranks:
            for start, end in _gaps(compute_spans.get(r, []), first, last):
                add(IDLE, f"rank {r}", start, end, "", f"{name}: rank {r} idle")
    return {category: rows[category] for category in CATEGORY_ORDER if category in rows}


def update_timeline_figure(fig: go.Figure, timeline: Timeline, *, name: str = "simulated",
                           show_idle: bool = True) -> bool:
    """Put ``timeline`` into ``fig`` (one ``timeline_figure`` of one timeline) in place.

    Only the bars' arrays change, so a ``FigureWidget`` sends one small
    update instead of a new figure. Returns False, leaving ``fig`` as it
    was, when the bar categories or the lanes differ (then draw a new figure).
    """
    rows = timeline_rows(timeline, name, show_idle=show_idle)
    if [t.name for t in fig.data] != [f"{category} ({name})" for category in rows]:
        return False
    if tuple(fig.layout.yaxis.categoryarray or ()) != tuple(_lanes([timeline])[::-1]):
        return False
    show_labels = len(timeline) <= _MAX_LABELS
    for trace, row in zip(fig.data, rows.values()):
        base = np.asarray(row["base"])
        changes: dict[str, Any] = {"base": base, "customdata": base, "x": np.asarray(row["x"])}
        text = row["text"] if show_labels else None
        for key, value in (("y", row["y"]), ("hovertext", row["hover"]), ("text", text)):
            current = getattr(trace, key)
            if value is None or current is None or tuple(current) != tuple(value):  # unchanged strings stay unsent
                changes[key] = value if value is None else np.array(value, dtype=object)
        for key, value in changes.items():  # plain property sets: the cheapest path in plotly
            setattr(trace, key, value)
    return True


def _bar_style(category: str, name: str) -> dict[str, Any]:
    """What every bar trace of ``category`` in the run ``name`` shares, whatever its bars."""
    return {"orientation": "h", "name": f"{category} ({name})", "legendgroup": f"{category}-{name}",
            "marker": {"color": CATEGORY_COLORS[category], "line": {"width": 0.5, "color": "white"}},
            "textposition": "inside", "insidetextanchor": "middle", "hovertemplate": _HOVER}


def _bars(timeline: Timeline, name: str, *, width: float, opacity: float, show_labels: bool,
          show_idle: bool, legend_seen: set | None, offset: float | None) -> list[go.Bar]:
    """One bar trace per op category; ``legend_seen`` (None: no legend) keeps one legend entry per look."""
    rows = timeline_rows(timeline, name, show_idle=show_idle)
    traces = []
    for category, row in rows.items():
        key = (category, opacity)
        traces.append(go.Bar(
            y=row["y"], base=row["base"], x=row["x"], width=width, offset=offset,
            showlegend=legend_seen is not None and key not in legend_seen, opacity=opacity,
            text=row["text"] if show_labels else None, hovertext=row["hover"], customdata=row["base"],
            **_bar_style(category, name)))
        if legend_seen is not None:
            legend_seen.add(key)
    return traces


# what changes in a slot from one reading to the next (its style stays)
_SLOT_PROPERTIES = ("y", "base", "x", "text", "hovertext", "customdata", "width", "offset", "opacity", "showlegend")


def timeline_slots(fig: go.Figure, names: Sequence[str]) -> go.Figure:
    """``fig`` (a single-panel timeline figure) with one bar trace per run in ``names`` and category, in order.

    A figure drawn from other timelines then has the same traces in the
    same order, absent pairs being empty traces, so a live view moves from
    one to the next by changing data only (:func:`update_timeline_slots`):
    no trace is ever added or removed, and no reading shows part of a figure.
    """
    by_name = {trace.name: trace for trace in fig.data}
    slots = []
    for name in names:
        for category in CATEGORY_ORDER:
            found = by_name.pop(f"{category} ({name})", None)
            slots.append(found if found is not None else
                         go.Bar(y=[], base=[], x=[], customdata=[], showlegend=False, **_bar_style(category, name)))
    if by_name:
        raise ValueError(f"timeline_slots: traces {sorted(by_name)} belong to none of the runs {list(names)}")
    fig.data = ()
    fig.add_traces(slots)
    return fig


def update_timeline_slots(fig: go.Figure, fresh: go.Figure) -> None:
    """Make ``fig`` show ``fresh`` (both from :func:`timeline_slots` with the same names) in one batch.

    On a ``FigureWidget`` the bars, the lanes and the title travel as one
    update message, which the browser draws in one go.
    """
    if [t.name for t in fig.data] != [t.name for t in fresh.data]:
        raise ValueError("update_timeline_slots needs two figures with the same slots (see timeline_slots)")
    with fig.batch_update():
        for trace, new in zip(fig.data, fresh.data):
            for key in _SLOT_PROPERTIES:
                trace[key] = new[key]
        fig.layout.title.text = fresh.layout.title.text
        fig.layout.height = fresh.layout.height
        fig.layout.yaxis.categoryorder = fresh.layout.yaxis.categoryorder
        fig.layout.yaxis.categoryarray = fresh.layout.yaxis.categoryarray


def _lanes(timelines: Sequence[Timeline]) -> list[str]:
    """Every lane, top to bottom: rank 0, its communication lane (if it communicates), rank 1, ..."""
    ranks = sorted({e.rank for t in timelines for e in t})
    communicating = {e.rank for t in timelines for e in t if category_of(e.op) in _COMM_CATEGORIES}
    lanes = []
    for r in ranks:
        lanes.append(f"rank {r}")
        if r in communicating:
            lanes.append(f"rank {r} comm")
    return lanes


def _names(timelines: Sequence[Timeline], names: Sequence[str] | None) -> list[str]:
    if names is None:
        return [t.events[0].source if t.events else f"run {i}" for i, t in enumerate(timelines)]
    if len(names) != len(timelines):
        raise ValueError(f"names has {len(names)} entries for {len(timelines)} timelines")
    return list(names)


def _draw(fig: go.Figure, timelines: Sequence[Timeline], names: Sequence[str], *, lanes: list[str],
          row: int | None, col: int | None, show_labels: bool, show_idle: bool, legend_seen: set | None) -> None:
    """Overlay ``timelines`` on ``lanes`` in ``fig`` (or its subplot): the one place timeline bars are drawn."""
    share = 0.8 / len(timelines)  # overlaid runs split each lane: the first on top, the next below it
    for i, (t, name) in enumerate(zip(timelines, names)):
        offset = None if len(timelines) == 1 else 0.4 - (i + 1) * share
        for trace in _bars(t, name, width=share, opacity=1.0 if i == 0 else MEASURED_OPACITY,
                           show_labels=show_labels, show_idle=show_idle, legend_seen=legend_seen, offset=offset):
            fig.add_trace(trace, row=row, col=col)
    # plotly puts the first category at the bottom, so the lanes go in reversed to read rank 0 at the top
    fig.update_yaxes(categoryorder="array", categoryarray=lanes[::-1], row=row, col=col)
    fig.update_layout(barmode="overlay")  # bars sit at their own base and offset, never stacked or grouped


def add_timeline(fig: go.Figure, timeline: Timeline | Sequence[Timeline], *, names: Sequence[str] | None = None,
                 row: int | None = None, col: int | None = None, show_idle: bool = True,
                 showlegend: bool = True) -> go.Figure:
    """Draw one timeline, or several overlaid (say predicted and measured), into ``fig``; returns ``fig``.

    ``row``/``col`` pick a subplot of a ``make_subplots`` figure (a figure
    that shows a timeline beside other panels); the figure's ``barmode``
    becomes "overlay". ``names`` label the timelines (default: their
    events' source, "simulated" or "measured").
    """
    timelines = _as_timelines(timeline)
    names = _names(timelines, names)
    _draw(fig, timelines, names, lanes=_lanes(timelines), row=row, col=col,
          show_labels=sum(len(t) for t in timelines) <= _MAX_LABELS, show_idle=show_idle,
          legend_seen=set() if showlegend else None)
    return fig


def timeline_figure(timeline: Timeline | Sequence[Timeline], *, title: str | None = None, compare: str = "overlay",
                    names: Sequence[str] | None = None, show_idle: bool = True) -> go.Figure:
    """Gantt chart of one timeline, or several overlaid (``compare="overlay"``) or stacked (``"side"``).

    A timeline's ``meta["marks"]`` (``{"time", "label"}``, e.g. where an adapting async pipeline changed its
    depths) are drawn as dashed vertical lines with their labels.

    ``names`` label the timelines (default: their events' source,
    "simulated" or "measured").
    """
    if compare not in ("overlay", "side"):
        raise ValueError(f"compare must be 'overlay' or 'side', got {compare!r}")
    timelines = _as_timelines(timeline)
    names = _names(timelines, names)
    lanes = _lanes(timelines)
    show_labels = sum(len(t) for t in timelines) <= _MAX_LABELS
    seen: set = set()
    panels = len(timelines) if compare == "side" else 1
    if panels > 1:
        fig = make_subplots(rows=panels, cols=1, shared_xaxes=True, subplot_titles=names, vertical_spacing=0.08)
        for i, (t, name) in enumerate(zip(timelines, names)):
            _draw(fig, [t], [name], lanes=lanes, row=i + 1, col=1, show_labels=show_labels, show_idle=show_idle,
                  legend_seen=seen)
    else:
        fig = go.Figure()
        _draw(fig, timelines, names, lanes=lanes, row=None, col=None, show_labels=show_labels, show_idle=show_idle,
              legend_seen=seen)
    apply_layout(fig, title=title or "Pipeline timeline", height=max(260, 60 + _LANE_PX * len(lanes) * panels),
                 legend={"y": 1.0, "yanchor": "bottom", "x": 1.0, "xanchor": "right"},
                 margin={"l": 90, "t": 80})
    fig.update_xaxes(title_text="time (ms)")
    for i, t in enumerate(timelines):  # run-time changes (an adapting async pipeline's new depths): a dashed line
        for mark in t.meta.get("marks", ()):
            fig.add_vline(x=mark["time"], line_dash="dash", line_color="#555", line_width=1,
                          annotation_text=mark["label"], annotation_position="top left",
                          annotation_font_size=10, **({"row": i + 1, "col": 1} if panels > 1 else {}))
    return fig
