"""The answer to "how is my run doing?": a job state plus one line per rank.

:class:`JobStatus` is what ``Job.status()`` returns, what ``status.json``
holds at the end and what ``workbench status`` prints. Job states follow the
run-directory contract (``PENDING RUNNING SUCCEEDED FAILED CANCELLED
UNKNOWN``); ranks add ``STALLED`` (running, but silent for longer than the
spec's ``stall_after_s``). A failed job carries its root cause: the rank
that failed first in the latest attempt, with its traceback. ``finished``
says nothing of the run is left running (also true for an ``UNKNOWN`` end,
when the processes are gone and nothing says how they ended).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..core.rundir import TERMINAL_STATES, adaptation_text

__all__ = ["JobStatus", "RankStatus"]


@dataclass(frozen=True)
class RankStatus:
    """One rank: state, progress, and how long ago it last said anything."""

    rank: int
    state: str
    step: int | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    heartbeat_age_s: float | None = None
    restart: int = 0
    pid: int | None = None
    host: str | None = None
    layers: tuple[str, ...] = ()  # per layer as it ran (per-layer plans), e.g. "block_3:fsdp+tp2+rc"
    device: str | None = None  # where the rank ran ("cuda:0", "cpu"), from its start event
    backend: str | None = None  # its collective backend ("nccl", "gloo", "staged")
    shared_by: int | None = None  # ranks of its node on its GPU (1: its own; None on CPU)


@dataclass(frozen=True)
class JobStatus:
    """A job's state, why it is in that state, and its ranks."""

    state: str
    reason: str = ""
    run_id: str = ""
    ranks: tuple[RankStatus, ...] = ()
    exit_codes: dict[str, int] | None = None
    restarts: int = 0
    root_cause: dict[str, Any] | None = None
    step: int | None = None
    final_loss: float | None = None
    updated: float = 0.0
    finished: bool = False
    last_eval: dict[str, Any] | None = None  # the latest evaluation (step, val_loss, accuracy, perplexity, ...)
    time_to_target: dict[str, Any] | None = None  # see RunState.time_to_target; None without a target
    adaptations: tuple[dict[str, Any], ...] = ()  # an adapting async pipeline's decisions (``adapt`` events)

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def stalled_ranks(self) -> list[int]:
        return [r.rank for r in self.ranks if r.state == "STALLED"]

    def rank(self, rank: int) -> RankStatus:
        for entry in self.ranks:
            if entry.rank == rank:
                return entry
        raise ValueError(f"rank must be one of {[r.rank for r in self.ranks]}, got {rank!r}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ranks"] = [asdict(r) for r in self.ranks]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobStatus":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["ranks"] = tuple(RankStatus(**r) for r in data.get("ranks", ()))
        values["adaptations"] = tuple(dict(a) for a in values.get("adaptations", ()))
        values.setdefault("finished", values.get("state") in TERMINAL_STATES)
        return cls(**values)

    def text(self) -> str:
        """A few lines for people: the state, the reason, a table of ranks, the root cause."""
        head = f"{self.run_id}: {self.state}" + (f" ({self.reason})" if self.reason else "")
        lines = [head]
        devices = self.devices_text()
        if devices:
            lines.append(devices)
        if self.restarts:
            lines.append(f"restarts: {self.restarts}")
        if self.ranks:
            lines.append(f"{'rank':>4}  {'state':<9} {'step':>6} {'loss':>10} {'samples/s':>10} {'heartbeat':>9}")
            for r in self.ranks:
                loss = f"{r.loss:.4g}" if r.loss is not None else "-"
                rate = f"{r.samples_per_s:.1f}" if r.samples_per_s is not None else "-"
                age = f"{r.heartbeat_age_s:.1f}s" if r.heartbeat_age_s is not None else "-"
                step = str(r.step) if r.step is not None else "-"
                lines.append(f"{r.rank:>4}  {r.state:<9} {step:>6} {loss:>10} {rate:>10} {age:>9}")
        lines += self._eval_lines()
        changes = [a for a in self.adaptations if a.get("changed")]
        if self.adaptations:
            lines.append(f"async pipeline re-decided {len(self.adaptations)} times, changed {len(changes)}"
                         + (":" if changes else ""))
            lines += [f"  {adaptation_text(a)}" for a in changes]
        if any(r.layers for r in self.ranks):
            lines.append("layers as run:")
            lines += [f"{r.rank:>4}  {' '.join(r.layers)}" for r in self.ranks if r.layers]
        if self.root_cause and self.root_cause.get("traceback"):
            lines += [f"root cause (rank {self.root_cause.get('rank')}):", self.root_cause["traceback"].rstrip()]
        return "\n".join(lines)

    def devices_text(self) -> str:
        """Where the ranks ran, one line: the devices and backend, and which GPUs ranks shared ("" before a start)."""
        started = [r for r in self.ranks if r.device]
        if not started:
            return ""
        backends = sorted({r.backend for r in started if r.backend})
        via = f" over {'/'.join(backends)}" if backends else ""
        if "staged" in backends:
            via += " (through host memory)"
        shared: dict[tuple[str | None, str], list[int]] = {}
        for r in started:
            if (r.shared_by or 1) > 1:
                shared.setdefault((r.host, r.device), []).append(r.rank)
        if not shared:
            return f"devices: {', '.join(_unique(r.device for r in started))}{via}"
        parts = [f"{device} shared by {len(ranks)} ranks ({', '.join(map(str, ranks))}), "
                 f"each capped at 1/{len(ranks)} of its memory" for (_, device), ranks in shared.items()]
        return f"GPU shared: {'; '.join(parts)}{via}"

    def _eval_lines(self) -> list[str]:
        lines = []
        if self.last_eval:
            e = self.last_eval
            parts = [f"eval at step {e.get('step')}: val_loss {_num(e.get('val_loss'))}"]
            parts += [f"{name} {_num(e.get(name))}" for name in ("accuracy", "perplexity") if e.get(name) is not None]
            lines.append(", ".join(parts))
        target = self.time_to_target
        if target:
            sign = ">=" if target["metric"] == "accuracy" else "<="
            head = f"target {target['metric']} {sign} {target['target']:g}: "
            if target.get("reached"):
                lines.append(head + f"reached at step {target.get('step')} after {_num(target.get('train_s'))} s "
                             f"of training, {_num(target.get('wall_s'))} s wall")
            else:
                lines.append(head + "not reached" + (f" (best {_num(target['best'])})"
                                                     if target.get("best") is not None else ""))
        return lines

    def __str__(self) -> str:
        return self.text()


def _unique(values: Any) -> list[str]:
    return list(dict.fromkeys(values))


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"
