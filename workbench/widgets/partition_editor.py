"""PartitionEditor: move pipeline stage boundaries by hand and see the pipeline change at once.

Problem. AMPA finds the best contiguous cut of a profiled model, but a
researcher learns why it is best only by trying others: shifting one
boundary by a layer moves work between two stages, changes the bottleneck,
the bubbles of every rank, the iteration time and the memory each stage
needs. Each of those is a partition re-costing plus a simulation, and the
view has to follow a slider without lag.

Approach. Everything that does not depend on the cut is prepared once per
configuration (model, stages, micro-batches, schedule, cluster): the
prefix-summed projection, the schedule value (whose lowering the simulator
remembers), and AMPA's optimum. A boundary move then costs one O(stages)
projection of the new partition, one ``StageCosts`` sum, one simulation and
an in-place update of the two figures (``update_balance_figure`` /
``update_timeline_figure`` inside ``batch_update``), well under 100 ms for a
100-layer model on 8 stages with 32 micro-batches (``bench/bench_widgets.py``).
The state after each update is :attr:`PartitionEditor.state` (an
:class:`EditorState`), so the logic is tested by setting controls in Python.
A GPU cluster preset projects the profile onto its GPU (FLOPs and bytes,
:func:`~workbench.profiling.projection.project`), so the cluster choice
changes the predicted times, not only the links and the memory cap.
"Launch" turns the current partition into a ``RunConfig`` (partition text,
the plan of the chosen schedule, real data of the model's kind: byte text
for language models, the handwritten digits otherwise, so the loss falls),
launches it and shows its ``JobMonitor``.

Page hooks (stable CSS classes for notebooks and browser tests): one
``IntSlider`` per boundary with class ``wb-boundary`` and description
``cut k``; value labels ``wb-bottleneck``, ``wb-bubble``, ``wb-iteration``,
``wb-memory``, ``wb-gap`` and ``wb-partition`` (their text starts with
"bottleneck", "bubble", "iteration", "peak memory", "gap to AMPA",
"partition"); errors in ``wb-error``; the button ``wb-launch``; the
monitor appears in ``wb-launch-output``. The whole editor has class
``wb-partition-editor``.

The state of one cut and the argument checks are in :mod:`.partition_state`,
the Launch in :mod:`.partition_launch`.
"""

from __future__ import annotations

import html
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Sequence

import ipywidgets as W
import plotly.graph_objects as go

from ..core.costs import ClusterSpec, ModelCosts
from ..core.fields import check_choice, check_int
from ..core.partition import Partition
from ..planning.partitioning.ampa import Projection, solve
from ..planning.costs.clusters import cluster_names, get_cluster
from ..planning.partitioning.partitioners import partition as run_partitioner
from ..core.plan import GPipe, GroPipe, Interleaved, OneFOneB, ParallelPlan
from ..scheduling.registry import schedule_for, stage_memory
from ..scheduling.simulate import simulate
from ..scheduling.stagecosts import StageCosts
from ..viz.balance import balance_figure, update_balance_figure
from ..viz.timeline import timeline_figure, update_timeline_figure
from .figure import figure_widget
from .partition_launch import EditorLaunch
from .partition_state import EditorState, _divisors, _zoo_names
from .schedule_explorer import display_view, label, refresh_figure

__all__ = ["PartitionEditor", "EditorState", "EDITOR_SCHEDULES", "EDITOR_ALGORITHMS"]

EDITOR_SCHEDULES = (GPipe.kind, OneFOneB.kind, Interleaved.kind, GroPipe.kind)
EDITOR_ALGORITHMS = ("ampa", "uniform", "params", "time", "pipedream")
NO_CLUSTER = "none (free communication)"
GIB = 2**30


class PartitionEditor(EditorLaunch):
    """Interactive partition editor over a profile (see the module docstring).

    ``model`` is a ``ModelCosts`` profile (your own) or a zoo name, profiled
    here at ``profile_batch`` samples (torch, cached on disk). The profile's
    batch is what one pipeline processes per iteration, split into
    ``num_microbatches``. ``cluster`` is a preset name, a ``ClusterSpec`` or
    None (free communication); its device memory is the cap AMPA respects.
    """
    def __init__(self, model: ModelCosts | str = "mlp", *, num_stages: int = 4, num_microbatches: int = 8,
                 schedule: str = "1f1b", algorithm: str = "ampa", cluster: str | ClusterSpec | None = "local-cpu",
                 groups: int = 2, chunks: int = 2, delay: int = 0, models: Sequence[str] | None = None,
                 profile_batch: int = 32, launch_steps: int = 20, run_root: str = "runs",
                 launch_backend: str = "local"):
        for name, value, minimum in (("num_stages", num_stages, 1), ("num_microbatches", num_microbatches, 1),
                                     ("groups", groups, 1), ("chunks", chunks, 1), ("profile_batch", profile_batch, 1),
                                     ("launch_steps", launch_steps, 1)):
            check_int(f"PartitionEditor {name}", value, minimum)
        check_choice("PartitionEditor schedule", schedule, EDITOR_SCHEDULES)
        check_choice("PartitionEditor algorithm", algorithm, EDITOR_ALGORITHMS)
        check_choice("PartitionEditor delay", delay, (0, 1))
        check_choice("PartitionEditor launch_backend", launch_backend, ("local", "dryrun"))
        cluster_name = self._known_clusters(cluster)
        self.profile_batch, self.launch_steps = profile_batch, launch_steps
        self.run_root, self.launch_backend = run_root, launch_backend
        self.costs = self._load_model(model)
        if num_stages > self.costs.num_layers:
            raise ValueError(f"PartitionEditor num_stages={num_stages} is more than the model's "
                             f"{self.costs.num_layers} layers; use at most {self.costs.num_layers}")
        if self.costs.batch_size % num_microbatches:
            raise ValueError(f"PartitionEditor num_microbatches={num_microbatches} does not divide the profile's "
                             f"batch of {self.costs.batch_size}; valid: {_divisors(self.costs.batch_size)}")
        self.job = None
        self.monitor = None
        self.state: EditorState | None = None
        self.algorithm_partition: Partition | None = None  # what the chosen algorithm cut, before any edit
        self.config_error = ""  # why the controls' configuration cannot be shown ("" when it can)
        self._syncing = False
        if models is None:
            models = _zoo_names() if isinstance(model, str) else []
        self._build_controls(models, num_stages, num_microbatches, schedule, algorithm, cluster_name, groups, chunks,
                             delay)
        self._configure()
        self._observe_controls()
        self.widget = self._layout()

    def _known_clusters(self, cluster: str | ClusterSpec | None) -> str:
        """Fill the cluster choices (presets, free communication, a given ``ClusterSpec``); the chosen one's name."""
        self._clusters: dict[str, ClusterSpec | None] = {NO_CLUSTER: None}
        self._clusters.update({name: None for name in cluster_names()})
        if isinstance(cluster, ClusterSpec):
            self._clusters[cluster.name] = cluster
            return cluster.name
        cluster_name = NO_CLUSTER if cluster is None else cluster
        check_choice("PartitionEditor cluster", cluster_name, list(self._clusters))
        return cluster_name

    def _build_controls(self, models: Sequence[str], num_stages: int, num_microbatches: int, schedule: str,
                        algorithm: str, cluster_name: str, groups: int, chunks: int, delay: int) -> None:
        """Every control, label and output area, at the arguments' values (no observer yet)."""
        style = {"description_width": "initial"}
        self.model = W.Dropdown(options=list(dict.fromkeys([self.costs.model, *models])), value=self.costs.model,
                                description="model", style=style)
        self.profile_path = W.Text(value="", placeholder="ModelCosts JSON (workbench profile --out)",
                                   description="profile", continuous_update=False, style=style)
        self.stages = W.IntSlider(value=num_stages, min=1, max=min(32, self.costs.num_layers), description="stages",
                                  continuous_update=False)
        self.microbatches = W.Dropdown(options=_divisors(self.costs.batch_size), value=num_microbatches,
                                       description="micro-batches", style=style)
        self.schedule = W.Dropdown(options=list(EDITOR_SCHEDULES), value=schedule, description="schedule")
        self.algorithm = W.Dropdown(options=list(EDITOR_ALGORITHMS), value=algorithm, description="algorithm")
        self.cluster = W.Dropdown(options=list(self._clusters), value=cluster_name, description="cluster")
        self.groups = W.IntSlider(value=groups, min=1, max=8, description="groups", continuous_update=False)
        self.chunks = W.IntSlider(value=chunks, min=1, max=4, description="chunks", continuous_update=False)
        self.delay = W.Dropdown(options=[0, 1], value=delay, description="delay")
        self.reset_button = W.Button(description="Reset to algorithm", icon="undo")
        self.boundaries: list[W.IntSlider] = []
        self.boundary_box = W.VBox(layout=W.Layout(width="100%"))
        self.labels = {key: label(f"wb-{key}") for key in ("bottleneck", "bubble", "iteration", "memory", "gap",
                                                            "partition")}
        self.error = label("wb-error")
        self.launch_button = W.Button(description="Launch", button_style="success", icon="rocket")
        self.launch_button.add_class("wb-launch")
        self.launch_output = W.Output()
        self.launch_output.add_class("wb-launch-output")
        self.balance_fig: go.FigureWidget | None = None
        self.timeline_fig: go.FigureWidget | None = None
        self.figure_box = W.VBox()

    def _observe_controls(self) -> None:
        for control in (self.stages, self.microbatches, self.schedule, self.cluster, self.groups, self.chunks,
                        self.delay):
            control.observe(self._on_config, names="value")
        self.algorithm.observe(lambda _change: self._apply_algorithm(), names="value")
        self.model.observe(self._on_model, names="value")
        self.profile_path.observe(self._on_profile_path, names="value")
        self.reset_button.on_click(lambda _b: self._apply_algorithm())
        self.launch_button.on_click(lambda _b: self._on_launch())

    def _layout(self) -> W.VBox:
        widget = W.VBox([
            W.HBox([self.model, self.profile_path]),
            W.HBox([self.stages, self.microbatches, self.schedule]),
            W.HBox([self.algorithm, self.cluster, self.reset_button]),
            W.HBox([self.groups, self.chunks, self.delay]),
            self.boundary_box,
            W.HBox([self.labels[k] for k in ("bottleneck", "bubble", "iteration", "memory", "gap")],
                   layout=W.Layout(justify_content="space-between")),
            self.labels["partition"], self.error, self.figure_box,
            W.HBox([self.launch_button]), self.launch_output,
        ])
        widget.add_class("wb-partition-editor")
        return widget

    # -- model and configuration -------------------------------------------------------------
    def _load_model(self, model: ModelCosts | str) -> ModelCosts:
        if isinstance(model, ModelCosts):
            return model
        if not isinstance(model, str) or not model:
            raise ValueError(f"PartitionEditor model must be a ModelCosts or a zoo model name, got {model!r}")
        from ..profiling import profile

        return profile(model, batch=self.profile_batch, progress=False)

    @property
    def num_virtual_stages(self) -> int:
        """Stages the model is cut into: ranks x chunks for the interleaved schedule."""
        return self.stages.value * (self.chunks.value if self.schedule.value == Interleaved.kind else 1)

    @property
    def cluster_spec(self) -> ClusterSpec | None:
        name = self.cluster.value
        if name not in self._clusters or (self._clusters[name] is None and name != NO_CLUSTER):
            self._clusters[name] = get_cluster(name)
        return self._clusters[name]

    @property
    def cluster_costs(self) -> ModelCosts:
        """The profile as the chosen cluster would run it: projected onto its GPU (FLOPs and bytes, roofline)
        for a GPU preset, as measured for this machine's clusters and without one."""
        cluster = self.cluster_spec
        if cluster is None or cluster.shared_compute or self.costs.device == cluster.device.name \
                or not any(layer.flops for layer in self.costs.layers):  # nothing to project from
            return self.costs
        key = (self.costs.model, id(self.costs), cluster.device.name)
        if getattr(self, "_projected", (None, None))[0] != key:
            from ..profiling.projection import project

            self._projected = (key, project(self.costs, cluster.device))
        return self._projected[1]

    def plan(self, partition: str = "uniform") -> ParallelPlan:
        """The parallel plan the controls describe (``partition``: the cut to launch, if any)."""
        return ParallelPlan.for_pipeline(self.schedule.value, self.stages.value, self.microbatches.value,
                                         groups=self.groups.value, chunks=self.chunks.value, delay=self.delay.value,
                                         partition=partition)

    def _configure(self) -> None:
        """Prepare everything that does not depend on the cut, then cut with the chosen algorithm."""
        V, m, cluster = self.num_virtual_stages, self.microbatches.value, self.cluster_spec
        self.groups.disabled = self.delay.disabled = self.schedule.value != GroPipe.kind
        self.chunks.disabled = self.schedule.value != Interleaved.kind
        try:
            plan = self.plan()
            if V > self.costs.num_layers:
                raise ValueError(f"{V} stages for {self.costs.num_layers} layers: use at most "
                                 f"{self.costs.num_layers} (stages x chunks)")
            if cluster is not None and cluster.world_size < plan.world_size:
                raise ValueError(f"cluster {cluster.name!r} has {cluster.world_size} devices, fewer than "
                                 f"{plan.dp} groups x {plan.pp} stages")
            schedule = schedule_for(plan)
            projection = Projection(self.cluster_costs, V, num_microbatches=m, cluster=cluster,
                                    schedule=stage_memory(plan))
            cap = cluster.device.memory_bytes if cluster else None
            optimum = solve(projection, cap)
        except ValueError as error:  # the previous configuration stays in force, and the error stays shown
            self.config_error = str(error)
            self._show_error(error)
            return
        self.config_error = ""
        self.schedule_value, self.projection, self.memory_cap, self.optimum = schedule, projection, cap, optimum
        self._set_boundary_count(V - 1)
        self._apply_algorithm()

    def _set_boundary_count(self, count: int) -> None:
        L = self.costs.num_layers
        if len(self.boundaries) != count:
            self.boundaries = []
            for k in range(count):
                slider = W.IntSlider(value=k + 1, min=1, max=L - 1, description=f"cut {k}",
                                     continuous_update=False, layout=W.Layout(width="95%"))
                slider.add_class("wb-boundary")
                slider.observe(self._on_boundary, names="value")
                self.boundaries.append(slider)
            self.boundary_box.children = self.boundaries
        for k, slider in enumerate(self.boundaries):  # stage k keeps at least one layer on each side
            with self._quiet():
                slider.min, slider.max = 1, L - 1
                slider.min, slider.max = k + 1, L - (count - k)

    def _apply_algorithm(self) -> None:
        algorithm = self.algorithm.value
        try:
            if algorithm == "ampa":
                chosen = self.optimum.partition
            else:
                chosen = run_partitioner(self.cluster_costs, self.num_virtual_stages, algorithm,
                                         num_microbatches=self.microbatches.value, cluster=self.cluster_spec,
                                         schedule=self.projection.memory).partition
        except ValueError as error:
            self._show_error(error)
            return
        self.algorithm_partition = chosen
        self.set_cuts(chosen.cuts)

    # -- boundaries ---------------------------------------------------------------------------
    @property
    def cuts(self) -> list[int]:
        """First layer of stages 1..V-1 (one per boundary control)."""
        return [s.value for s in self.boundaries]

    def set_cuts(self, cuts: Sequence[int]) -> None:
        """Move every boundary at once, then update (one update, not one per control)."""
        if len(cuts) != len(self.boundaries):
            raise ValueError(f"set_cuts needs {len(self.boundaries)} cuts (one per boundary), got {list(cuts)}")
        Partition.from_cuts(list(cuts), self.costs.num_layers)
        with self._quiet():
            for slider, value in zip(self.boundaries, cuts):
                slider.value = value
        self.refresh()

    def _on_boundary(self, change) -> None:
        if self._syncing:
            return
        moved = self.boundaries.index(change["owner"])
        values = self.cuts
        for k in range(moved + 1, len(values)):  # push the neighbours along so every stage keeps a layer
            values[k] = max(values[k], values[k - 1] + 1)
        for k in range(moved - 1, -1, -1):
            values[k] = min(values[k], values[k + 1] - 1)
        self.set_cuts(values)

    @contextmanager
    def _quiet(self):
        """Set controls without their observers reacting (one update follows, not one per control)."""
        outer, self._syncing = self._syncing, True
        try:
            yield
        finally:
            self._syncing = outer

    # -- the update after every move ---------------------------------------------------------------
    def evaluate(self, partition: Partition) -> EditorState:
        """Project and simulate ``partition`` under the current configuration (no widget change)."""
        result = self.projection.evaluate(partition, "manual", self.memory_cap)
        cluster = self.cluster_spec
        stage_costs = StageCosts.from_model(self.cluster_costs, partition, self.projection.microbatch_size,
                                            device=cluster.device if cluster else None)
        sim = simulate(self.schedule_value, stage_costs, cluster, microbatch_size=self.projection.microbatch_size)
        return EditorState(partition, result, self.optimum, sim)

    def refresh(self) -> EditorState | None:
        """Re-cost, re-simulate and redraw the current partition; returns the new state."""
        try:
            self.state = self.evaluate(Partition.from_cuts(self.cuts, self.costs.num_layers))
        except ValueError as error:
            self._show_error(error)
            return None
        self.error.value = "" if not self.config_error else self.error.value
        self._update_labels(self.state)
        self._update_figures(self.state)
        return self.state

    def _update_labels(self, state: EditorState) -> None:
        peak = max(state.peak_memory_bytes)
        cap = self.memory_cap
        over = f" <b style='color:#d62728'>over the {cap / GIB:.3g} GiB cap</b>" if cap and peak > cap else ""
        self.labels["bottleneck"].value = (f"bottleneck <b>{state.bottleneck_ms:.3f} ms</b> "
                                           f"(stage {state.bottleneck_stage})")
        self.labels["bubble"].value = f"bubble <b>{100 * state.bubble_fraction:.1f}%</b>"
        self.labels["iteration"].value = f"iteration <b>{state.iteration_ms:.3f} ms</b>"
        self.labels["memory"].value = f"peak memory <b>{peak / GIB:.3f} GiB</b>{over}"
        self.labels["gap"].value = (f"gap to AMPA <b>{100 * state.gap:+.1f}%</b> "
                                    f"(optimum {self.optimum.bottleneck_ms:.3f} ms)")
        origin = self.algorithm.value if state.partition == self.algorithm_partition else "edited"
        self.labels["partition"].value = f"partition <code>{state.partition}</code> ({origin})"

    def _balance_data(self, state: EditorState) -> dict[str, Any]:
        r = state.result
        return {"forward_ms": r.stage_forward_ms, "backward_ms": r.stage_backward_ms, "comm_ms": r.stage_comm_ms,
                "memory_bytes": r.stage_memory_bytes, "memory_cap_bytes": self.memory_cap,
                "partition": state.partition}

    def _update_figures(self, state: EditorState) -> None:
        title = (f"{self.schedule.value}: {self.num_virtual_stages} stages x {self.microbatches.value} micro-batches"
                 f", iteration {state.iteration_ms:.3f} ms")
        balance = self._balance_data(state)
        if self.balance_fig is None:
            self.balance_fig = figure_widget(balance_figure(balance))
            self.timeline_fig = figure_widget(timeline_figure(state.sim.timeline, title=title))
            self.figure_box.children = [self.balance_fig, self.timeline_fig]
            return
        refresh_figure(self.balance_fig, lambda fig: update_balance_figure(fig, balance),
                       lambda: balance_figure(balance))
        refresh_figure(self.timeline_fig, lambda fig: update_timeline_figure(fig, state.sim.timeline),
                       lambda: timeline_figure(state.sim.timeline, title=title), title=title)

    def _show_error(self, error: Exception) -> None:
        self.error.value = f"<span style='color:#d62728'>{html.escape(str(error))}</span>"

    # -- control callbacks ----------------------------------------------------------------------
    def _on_config(self, _change=None) -> None:
        if self._syncing:
            return
        self._configure()

    def _on_model(self, change) -> None:
        if change["new"] == self.costs.model:
            return
        try:
            self._set_costs(self._load_model(change["new"]))
        except ValueError as error:
            self._show_error(error)

    def _on_profile_path(self, change) -> None:
        path = change["new"].strip()
        if not path:
            return
        try:
            self._set_costs(ModelCosts.load(Path(path)))
        except (ValueError, OSError) as error:
            self._show_error(error)

    def _set_costs(self, costs: ModelCosts) -> None:
        self.costs = costs
        with self._quiet():
            if costs.model not in self.model.options:
                self.model.options = [*self.model.options, costs.model]
            self.model.value = costs.model
            self.stages.max = min(32, costs.num_layers)
            divisors = _divisors(costs.batch_size)
            keep = self.microbatches.value if self.microbatches.value in divisors else divisors[-1]
            self.microbatches.options = divisors
            self.microbatches.value = keep
        self._configure()

    # -- display ------------------------------------------------------------------------------------
    def figures(self) -> list[go.Figure]:
        """The current balance and timeline as static figures."""
        if self.state is None:
            return []
        return [balance_figure(self._balance_data(self.state)),
                timeline_figure(self.state.sim.timeline, title=f"{self.schedule.value} timeline")]

    def summary(self) -> str:
        """The value labels as one HTML line."""
        return " | ".join(self.labels[k].value for k in ("partition", "bottleneck", "bubble", "iteration", "memory",
                                                          "gap"))

    def _ipython_display_(self) -> None:
        display_view(self.widget, self.figures, self.summary)
