"""Adaptive micro-batches in flight: how deep each stage of an async pipeline runs ahead.

Problem: in an asynchronous 1F1B pipeline stage ``s`` can keep up to
``S - s`` micro-batches in flight. More in flight fills the pipeline (fewer
bubbles) but every one holds its saved activations, and every iteration in
flight holds a stashed weight version; on a tight memory budget the full
depth does not fit, and on uneven stages part of it buys nothing.

Approach: the in-flight caps are a short vector (non-increasing along the
pipeline, see :func:`~workbench.scheduling.generators.async_inflight`), so
the candidates are few: every uniform cap ``k = 1..S``, plus, per candidate,
the vector obtained by lowering the caps of the stages that break the
memory cap until they fit. Each candidate is built with the real generator,
its peak memory per stage read off the memory model (activations and stashed
versions included) and its steady-state iteration time taken from the
simulator on the stage costs. Among the candidates that fit, the choice is
the one with the fewest micro-batches in flight whose simulated iteration
time is within ``tolerance`` of the fastest: the same throughput for less
memory. Nothing fitting is an error that says how much memory the smallest
candidate needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.costs import ClusterSpec
from ..core.fields import check, check_int, integer, optional
from .generators import ASYNC_MODES, async_1f1b, async_inflight
from .memory import peak_memory_bytes
from .simulate import simulate
from .stagecosts import StageCosts

__all__ = ["Adaptation", "InflightChoice", "adapt_inflight", "choose_inflight", "evaluate_inflight"]

_ITERATIONS = 4  # enough iterations for the steady state to dominate the simulated time


@dataclass(frozen=True)
class InflightChoice:
    """The chosen caps, their predicted iteration time and peak memory, and every candidate weighed."""

    inflight: tuple[int, ...]
    iteration_ms: float
    peak_bytes: tuple[int, ...]
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def table(self) -> str:
        """The candidates as a text table, the chosen one marked."""
        lines = [f"{'in flight':<16}{'iteration ms':>14}{'peak MB (max)':>15}  fits  chosen"]
        for c in self.candidates:
            mark = "*" if tuple(c["inflight"]) == self.inflight else ""
            lines.append(f"{str(tuple(c['inflight'])):<16}{c['iteration_ms']:>14.3f}"
                         f"{max(c['peak_bytes']) / 2**20:>15.2f}  {'yes' if c['fits'] else 'no':<4}  {mark}")
        return "\n".join(lines)


def evaluate_inflight(stage_costs: StageCosts, num_microbatches: int, inflight: tuple[int, ...], *,
                      mode: str = "stash", cluster: ClusterSpec | None = None) -> dict[str, Any]:
    """Simulated steady-state iteration time and peak memory per stage of one choice of caps."""
    schedule = async_1f1b(stage_costs.num_stages, num_microbatches, _ITERATIONS, inflight=inflight, mode=mode)
    result = simulate(schedule, stage_costs, cluster)
    return {"inflight": list(inflight), "iteration_ms": result.metrics["iteration_ms"],
            "peak_bytes": peak_memory_bytes(schedule, stage_costs)}


def _fit_to_memory(caps: tuple[int, ...], peaks: list[int], cap_bytes: int) -> tuple[int, ...] | None:
    """Lower the caps of the stages over budget by one (and of later stages, to stay non-increasing)."""
    lowered = list(caps)
    for s, peak in enumerate(peaks):
        if peak > cap_bytes:
            if lowered[s] == 1:
                return None
            lowered[s] -= 1
    for s in range(1, len(lowered)):
        lowered[s] = min(lowered[s], lowered[s - 1])
    return tuple(lowered)


def choose_inflight(stage_costs: StageCosts, num_microbatches: int, *, memory_cap_bytes: int | None = None,
                    mode: str = "stash", cluster: ClusterSpec | None = None,
                    tolerance: float = 0.02) -> InflightChoice:
    """Micro-batches in flight per stage: the fewest that run within ``tolerance`` of the fastest and fit."""
    check_int("num_microbatches", num_microbatches, 1)
    check("memory_cap_bytes", memory_cap_bytes, optional(integer(1)))
    if mode not in ASYNC_MODES:
        raise ValueError(f"mode must be one of {', '.join(ASYNC_MODES)}, got {mode!r}")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    S = stage_costs.num_stages
    seen: dict[tuple[int, ...], dict[str, Any]] = {}
    todo = [async_inflight(S, k) for k in range(1, S + 1)]
    while todo:
        caps = todo.pop(0)
        if caps in seen:
            continue
        row = evaluate_inflight(stage_costs, num_microbatches, caps, mode=mode, cluster=cluster)
        row["fits"] = memory_cap_bytes is None or max(row["peak_bytes"]) <= memory_cap_bytes
        seen[caps] = row
        if not row["fits"]:
            lowered = _fit_to_memory(caps, row["peak_bytes"], memory_cap_bytes)
            if lowered is not None:
                todo.append(lowered)
    candidates = sorted(seen.values(), key=lambda r: (sum(r["inflight"]), r["inflight"]))
    fitting = [r for r in candidates if r["fits"]]
    if not fitting:
        smallest = min(max(r["peak_bytes"]) for r in candidates)
        raise ValueError(f"no choice of micro-batches in flight fits memory_cap_bytes={memory_cap_bytes} "
                         f"({memory_cap_bytes / 2**20:.1f} MiB); even one in flight per stage needs "
                         f"{smallest} bytes ({smallest / 2**20:.1f} MiB) on its largest stage")
    fastest = min(r["iteration_ms"] for r in fitting)
    best = next(r for r in fitting if r["iteration_ms"] <= fastest * (1 + tolerance))
    return InflightChoice(tuple(best["inflight"]), best["iteration_ms"], tuple(best["peak_bytes"]), candidates)


@dataclass(frozen=True)
class Adaptation:
    """A run-time re-decision of an async pipeline: the depths and mode it runs next, and why."""

    inflight: tuple[int, ...]
    mode: str
    iteration_ms: float | None
    reason: str

    def changes(self, inflight: tuple[int, ...], mode: str) -> bool:
        return (tuple(self.inflight), self.mode) != (tuple(inflight), mode)


def adapt_inflight(stage_costs: StageCosts, num_microbatches: int, *, inflight: tuple[int, ...], mode: str,
                   configured_mode: str = "stash", memory_cap_bytes: int | None = None,
                   tolerance: float = 0.02) -> Adaptation:
    """The depths and stash mode an async pipeline running ``inflight`` in ``mode`` should run next, from
    ``stage_costs`` measured so far (:func:`choose_inflight` on them).

    The configured mode is kept while some depth of it fits ``memory_cap_bytes``; otherwise PipeDream-2BW's two
    weight versions (or back to stashing one version per iteration in flight) where that fits and the
    micro-batches allow it (2BW needs at least as many as stages). A change must be predicted faster by more than
    ``tolerance`` or be needed to fit; else the current choice stays.
    """
    if mode not in ASYNC_MODES or configured_mode not in ASYNC_MODES:
        raise ValueError(f"modes must be among {', '.join(ASYNC_MODES)}, got {mode!r} and {configured_mode!r}")
    S = stage_costs.num_stages
    current = evaluate_inflight(stage_costs, num_microbatches, tuple(inflight), mode=mode)
    current_fits = memory_cap_bytes is None or max(current["peak_bytes"]) <= memory_cap_bytes
    other = "2bw" if configured_mode == "stash" else "stash"
    modes = [configured_mode] + ([other] if other == "stash" or num_microbatches >= S else [])
    misses = []
    for candidate_mode in modes:
        try:
            choice = choose_inflight(stage_costs, num_microbatches, memory_cap_bytes=memory_cap_bytes,
                                     mode=candidate_mode, tolerance=tolerance)
        except ValueError as exc:
            misses.append(f"mode {candidate_mode}: {exc}")
            continue
        if not current_fits:
            return Adaptation(choice.inflight, candidate_mode, choice.iteration_ms,
                              f"{tuple(inflight)} in mode {mode} needs {max(current['peak_bytes']) / 2**20:.1f} MiB "
                              f"on its largest stage, over the {memory_cap_bytes / 2**20:.1f} MiB cap")
        if choice.iteration_ms < current["iteration_ms"] * (1 - tolerance) or candidate_mode != mode:
            return Adaptation(choice.inflight, candidate_mode, choice.iteration_ms,
                              f"predicted {choice.iteration_ms:.1f} ms per iteration from the measured stage times, "
                              f"against {current['iteration_ms']:.1f} ms for {tuple(inflight)} in mode {mode}")
        break
    reason = "; ".join(misses) if misses else (f"{tuple(inflight)} in mode {mode} is within {tolerance:.0%} of the "
                                                f"fastest that fits ({current['iteration_ms']:.1f} ms predicted)")
    return Adaptation(tuple(inflight), mode, current["iteration_ms"], reason)
