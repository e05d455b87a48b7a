"""What is known about a run, folded from its events: per-rank state, metric columns, timelines.

The widget, the static figure, ``Job.status()`` and the CLI all need the same
answers (which rank is at which step, which one stalled, what the loss curve
is, what the last iteration looked like, how often torchrun restarted), so
one pure-Python model folds events into them and every view reads it. It
holds metrics as growing numpy columns (cheap to hand to plotly), keeps
stage events for the latest few iterations only (memory stays bounded on
long runs), and never touches widgets, files or processes, so it is tested
with hand-written events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..core.config_upgrade import upgrade
from ..core.fields import is_number
from ..core.rundir import adaptation_text
from ..core.timeline import Event, Timeline

__all__ = ["RankState", "RunState", "MetricColumns", "RANK_STATES", "METRIC_FIELDS", "EVAL_FIELDS", "EvalTargets"]

RANK_STATES = ("PENDING", "RUNNING", "STALLED", "SUCCEEDED", "FAILED", "CANCELLED")
METRIC_FIELDS = ("t", "step", "loss", "samples_per_s", "step_ms", "memory_bytes", "restart")
EVAL_FIELDS = ("t", "step", "val_loss", "accuracy", "perplexity", "samples", "eval_s", "train_s", "wall_s")
_KEPT_ITERATIONS = 4


class MetricColumns:
    """Append-only float64 columns with amortised growth (NaN where a field was absent)."""

    def __init__(self, names: Iterable[str] = METRIC_FIELDS, capacity: int = 256):
        self.names = tuple(names)
        self._data = np.full((len(self.names), capacity), np.nan)
        self.size = 0

    def append(self, values: dict[str, Any]) -> None:
        if self.size == self._data.shape[1]:
            grown = np.full((len(self.names), 2 * self.size), np.nan)
            grown[:, : self.size] = self._data
            self._data = grown
        for i, name in enumerate(self.names):
            value = values.get(name)
            self._data[i, self.size] = float(value) if isinstance(value, (int, float)) and value is not None else np.nan
        self.size += 1

    def column(self, name: str) -> np.ndarray:
        return self._data[self.names.index(name), : self.size]

    def __len__(self) -> int:
        return self.size


@dataclass
class RankState:
    """The latest known facts about one rank."""

    rank: int
    started: bool = False
    step: int | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    last_event_t: float | None = None
    start_t: float | None = None
    pid: int | None = None
    host: str | None = None
    restart: int = 0
    end_status: str | None = None
    error: dict[str, Any] | None = None
    layers: tuple[str, ...] = ()  # what each of the rank's layers ran, from its start event
    device: str | None = None  # from the start event: where the rank ran, its collective backend, and how many
    backend: str | None = None  # ranks of its node shared its GPU (1: its own; None on CPU)
    shared_by: int | None = None

    def state(self, now: float, stall_after_s: float) -> str:
        if self.error is not None:
            return "FAILED"
        if self.end_status is not None:
            return self.end_status if self.end_status in RANK_STATES else "SUCCEEDED"
        if not self.started:
            return "PENDING"
        if self.last_event_t is not None and now - self.last_event_t > stall_after_s:
            return "STALLED"
        return "RUNNING"

    def heartbeat_age(self, now: float) -> float | None:
        return None if self.last_event_t is None else max(0.0, now - self.last_event_t)


@dataclass(frozen=True)
class EvalTargets:
    """What a run evaluates for, from the config in its start event (0: no target, as in the config)."""

    eval_every: int = 0
    target_accuracy: float = 0.0
    target_perplexity: float = 0.0

    @classmethod
    def from_config(cls, config: Any) -> "EvalTargets":
        """From a run config's dict, grouped (``[evaluation]``) or of the earlier flat format."""
        try:
            evaluation = upgrade(config).get("evaluation") if isinstance(config, dict) else None
        except ValueError:  # a config that does not load has no targets to show
            evaluation = None
        evaluation = evaluation if isinstance(evaluation, dict) else {}

        def number(name: str) -> float:
            value = evaluation.get(name)
            return float(value) if is_number(value) else 0.0

        return cls(int(number("every")), number("target_accuracy"), number("target_perplexity"))

    @property
    def metric(self) -> str | None:
        """The metric a target is set on: ``"accuracy"`` (reached at >=), ``"perplexity"`` (at <=), or None."""
        return "accuracy" if self.target_accuracy else "perplexity" if self.target_perplexity else None


@dataclass
class RunState:
    """Everything folded from a run's events so far; ``version`` grows with every change."""

    stall_after_s: float = 30.0
    ranks: dict[int, RankState] = field(default_factory=dict)
    metrics: dict[int, MetricColumns] = field(default_factory=dict)
    stages: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    adaptations: list[dict[str, Any]] = field(default_factory=list)  # an adapting async pipeline's decisions
    world_size: int | None = None
    restarts: int = 0
    version: int = 0
    last_event_t: float | None = None
    evals: MetricColumns = field(default_factory=lambda: MetricColumns(EVAL_FIELDS, capacity=32))
    targets: EvalTargets = field(default_factory=EvalTargets)

    def rank(self, rank: int) -> RankState:
        if rank not in self.ranks:
            self.ranks[rank] = RankState(rank)
        return self.ranks[rank]

    def apply(self, events: Iterable[dict[str, Any]]) -> int:
        """Fold events in; return how many were applied (unknown kinds are skipped)."""
        applied = 0
        for event in events:
            handler = getattr(self, f"_on_{event.get('kind')}", None)
            rank = event.get("rank")
            if handler is None or not isinstance(rank, int):
                continue
            state = self.rank(rank)
            stamp = event.get("t")
            if isinstance(stamp, (int, float)):
                state.last_event_t = max(state.last_event_t or stamp, stamp)
                self.last_event_t = max(self.last_event_t or stamp, stamp)
            handler(state, event)
            applied += 1
        if applied:
            self.version += 1
        return applied

    def _on_start(self, state: RankState, event: dict[str, Any]) -> None:
        restart = int(event.get("restart") or 0)
        if state.started and restart <= state.restart:
            restart = state.restart + 1
        state.started, state.restart = True, restart
        state.end_status, state.error = None, None
        state.start_t = event.get("t")
        state.pid, state.host = event.get("pid"), event.get("host")
        state.device, state.backend = event.get("device"), event.get("backend")
        state.shared_by = event["shared_by"] if isinstance(event.get("shared_by"), int) else None
        state.layers = tuple(_layer_text(layer) for layer in event.get("layers") or () if isinstance(layer, dict))
        if isinstance(event.get("world_size"), int):
            self.world_size = event["world_size"]
        if isinstance(event.get("config"), dict):
            self.targets = EvalTargets.from_config(event["config"])
        self.restarts = max(self.restarts, restart)

    def _on_step(self, state: RankState, event: dict[str, Any]) -> None:
        state.step = event.get("step", state.step)
        state.loss = event.get("loss", state.loss)
        state.samples_per_s = event.get("samples_per_s", state.samples_per_s)
        columns = self.metrics.setdefault(state.rank, MetricColumns())
        columns.append({**event, "restart": state.restart})

    def _on_heartbeat(self, state: RankState, event: dict[str, Any]) -> None:
        if event.get("step") is not None and state.step is None:
            state.step = event["step"]

    def _on_checkpoint(self, state: RankState, event: dict[str, Any]) -> None:
        self.checkpoints.append({"rank": state.rank, "step": event.get("step"), "path": event.get("path"),
                                 "t": event.get("t")})

    def _on_eval(self, state: RankState, event: dict[str, Any]) -> None:
        self.evals.append(event)

    def _on_adapt(self, state: RankState, event: dict[str, Any]) -> None:
        self.adaptations.append({k: event.get(k) for k in ("step", "inflight_from", "inflight_to", "mode_from",
                                                            "mode_to", "changed", "reason", "at")})

    def _on_end(self, state: RankState, event: dict[str, Any]) -> None:
        state.end_status = event.get("status", "SUCCEEDED")
        state.step = event.get("step", state.step)

    def _on_error(self, state: RankState, event: dict[str, Any]) -> None:
        record = {"rank": state.rank, "t": event.get("t"), "message": event.get("message", ""),
                  "traceback": event.get("traceback", ""), "exc_type": event.get("exc_type", ""),
                  "restart": state.restart}
        state.error = record
        self.errors.append(record)

    def _on_stage(self, state: RankState, event: dict[str, Any]) -> None:
        kept = self.stages.setdefault(state.rank, [])
        kept.append(event)
        iterations = sorted({e.get("iteration", 0) for e in kept})
        if len(iterations) > _KEPT_ITERATIONS:
            oldest = set(iterations[: len(iterations) - _KEPT_ITERATIONS])
            kept[:] = [e for e in kept if e.get("iteration", 0) not in oldest]

    # -- answers ---------------------------------------------------------------------
    def rank_states(self, now: float | None = None) -> dict[int, str]:
        now = time.time() if now is None else now
        return {r: s.state(now, self.stall_after_s) for r, s in sorted(self.ranks.items())}

    def root_cause(self) -> dict[str, Any] | None:
        """The first error of the latest attempt (later ones are usually peers losing their connection)."""
        if not self.errors:
            return None
        latest = max(e["restart"] for e in self.errors)
        attempt = [e for e in self.errors if e["restart"] == latest]
        return min(attempt, key=lambda e: e["t"] if isinstance(e["t"], (int, float)) else float("inf"))

    def measured_iterations(self) -> list[int]:
        """Iterations that every rank has reported: every rank of the run where its start event gave the world
        size (a rank whose stage events have not been read yet holds the iteration back: the timeline never
        shows part of an iteration), else every rank that reported stages."""
        per_rank = [{e.get("iteration", 0) for e in events} for events in self.stages.values() if events]
        if self.world_size and len(per_rank) < self.world_size:
            return []
        return sorted(set.intersection(*per_rank)) if per_rank else []

    def timeline(self, iteration: int | None = None) -> Timeline:
        """Measured timeline of ``iteration`` (default: the latest complete one), starting at 0 ms."""
        if iteration is None:
            complete = self.measured_iterations()
            if len(complete) > 1:
                iteration = complete[-2]
            elif complete:
                iteration = complete[-1]
            else:
                return Timeline((), {"source": "measured"})
        rows = [e for events in self.stages.values() for e in events if e.get("iteration", 0) == iteration]
        absolute = [(e, float(e.get("t0", 0.0)) * 1000.0) for e in rows]
        origin = min((base + float(e["start"]) for e, base in absolute), default=0.0)
        out = []
        for e, base in absolute:
            out.append(Event(rank=e["rank"], stage=int(e.get("stage", 0)), op=e["op"],
                             start=base + float(e["start"]) - origin, end=base + float(e["end"]) - origin,
                             microbatch=e.get("microbatch"), iteration=int(iteration), version=e.get("version"),
                             source="measured", chunk=e.get("chunk"), peer=e.get("peer"), nbytes=e.get("nbytes")))
        meta: dict[str, Any] = {"source": "measured", "iteration": iteration}
        marks = [{"time": max(0.0, float(a["at"]) * 1000.0 - origin), "step": a["step"], "label": adaptation_text(a)}
                 for a in self.adaptations if a.get("changed") and a.get("step") == iteration
                 and isinstance(a.get("at"), (int, float))]
        return Timeline(tuple(out), {**meta, "marks": marks} if marks else meta)

    def latest_step(self) -> int | None:
        steps = [s.step for s in self.ranks.values() if s.step is not None]
        return max(steps) if steps else None

    def final_loss(self) -> float | None:
        """The last reported loss of the lowest rank that reported one."""
        for rank in sorted(self.metrics):
            losses = self.metrics[rank].column("loss")
            finite = losses[np.isfinite(losses)]
            if finite.size:
                return float(finite[-1])
        return None

    def eval_series(self) -> dict[str, np.ndarray]:
        """Every evaluation so far, as columns (:data:`EVAL_FIELDS`; NaN where a field was absent)."""
        return {name: self.evals.column(name).copy() for name in EVAL_FIELDS}

    def last_eval(self) -> dict[str, Any] | None:
        """The latest evaluation's fields (None before the first)."""
        if not len(self.evals):
            return None
        values = {name: float(self.evals.column(name)[-1]) for name in EVAL_FIELDS}
        out: dict[str, Any] = {name: (None if not np.isfinite(v) else v) for name, v in values.items()}
        out["step"] = None if out["step"] is None else int(out["step"])
        return out

    def time_to_target(self) -> dict[str, Any] | None:
        """When the run first reached its target: ``metric``, ``target``, ``reached`` and, once reached, the
        ``step``, ``train_s`` (training seconds: step times only) and ``wall_s`` of that evaluation (else None);
        ``best`` is the best value evaluated so far. None when the run has no target."""
        metric = self.targets.metric
        if metric is None:
            return None
        target = self.targets.target_accuracy if metric == "accuracy" else self.targets.target_perplexity
        values = self.evals.column(metric)
        finite = values[np.isfinite(values)]
        best = None if not finite.size else float(finite.max() if metric == "accuracy" else finite.min())
        hits = np.nonzero(values >= target if metric == "accuracy" else values <= target)[0]
        out: dict[str, Any] = {"metric": metric, "target": target, "reached": bool(hits.size), "best": best,
                               "step": None, "train_s": None, "wall_s": None}
        if hits.size:
            first = int(hits[0])
            for name in ("step", "train_s", "wall_s"):
                value = float(self.evals.column(name)[first])
                out[name] = None if not np.isfinite(value) else int(value) if name == "step" else value
        return out

    def summary_rows(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        return [{"rank": r, "state": s.state(now, self.stall_after_s), "step": s.step, "loss": s.loss,
                 "samples_per_s": s.samples_per_s, "heartbeat_age_s": s.heartbeat_age(now), "restart": s.restart,
                 "pid": s.pid, "host": s.host, "layers": s.layers, "device": s.device, "backend": s.backend,
                 "shared_by": s.shared_by} for r, s in sorted(self.ranks.items())]


def _layer_text(layer: dict[str, Any]) -> str:
    """One realised layer of a start event, short: ``block_3:fsdp+tp2+rc``."""
    text = f"{layer.get('name', layer.get('index', '?'))}:{layer.get('dp', '?')}"
    if int(layer.get("tp_degree") or 1) > 1:
        text += f"+tp{layer['tp_degree']}"
    return text + ("+rc" if layer.get("recompute") else "")

