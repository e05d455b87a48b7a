"""The run directory: the contract between a running job and the notebook.

A launch gets a fresh directory; the job writes into it and the notebook (or
the CLI, or a later kernel after a restart) only reads it. Nothing else is
shared, so a job can be attached to from anywhere that sees the files.

Layout::

    <run_dir>/
      config.json            resolved run config (machine-written)
      command.txt            the exact command line(s) launched
      launch.json            backend, pids / job id, start time, hostname
      events/rank{r}.jsonl   one JSON object per line per rank (schema below)
      logs/                  torchrun logs (per rank stdout/stderr)
      checkpoints/step{N}/   checkpoints
      tensorboard/           rank 0's TensorBoard scalars (config tensorboard = true)
      status.json            final status, written once at the end

Event lines (``EVENT_SCHEMA_VERSION`` = 1): every line has ``v`` (schema
version), ``kind``, ``t`` (unix time, seconds) and ``rank``. Kinds and their
extra fields:

- ``start``: ``world_size``, ``strategy``, ``config`` (dict), ``pid``, ``host``, ``restart`` (count) (the
  training entry adds ``device``, ``backend``, the collective backend it initialised (``staged`` when ranks
  share a GPU), ``shared_by``, how many ranks of the node share its GPU (1: its own; null on CPU),
  ``memory_fraction``, the share of the GPU's memory its allocator is capped at, and ``process``, the
  torchrun rank of the process, which differs from ``rank`` under a config's ``placement``)
- ``step``: ``step``, ``loss``, ``samples_per_s``, ``step_ms``, ``memory_bytes`` (and optional ``lr``; per-layer
  plans add ``memory``: the rank's own count of parameters, gradients, optimizer state and saved activations)
- ``stage``: one executed action as a timeline event: the ``Event`` fields
  (``stage``, ``op``, ``microbatch``, ``iteration``, ``version``, ``start``, ``end`` in ms
  relative to ``t0``; plus ``t0``, the unix time those ms count from)
- ``heartbeat``: ``step``
- ``checkpoint``: ``step``, ``path``
- ``eval`` (rank 0): ``step``, ``val_loss``, ``accuracy`` (top-1 of a classifier, token accuracy of a language
  model), ``perplexity`` (language models, else null), ``samples``, ``tokens`` (language models), ``eval_s``,
  ``train_s`` (training seconds so far: step times, evaluations excluded) and ``wall_s`` (since training began)
- ``end``: ``step``, ``status`` ("SUCCEEDED" | "CANCELLED")
- ``error``: ``message``, ``traceback``, ``exc_type``

Readers must skip kinds they do not know (forward compatibility).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .fields import check_int
from .timeline import Event, Timeline

__all__ = [
    "read_events", "load_measured_timeline", "adaptation_text",
    "EVENT_SCHEMA_VERSION", "EVENT_KINDS", "JOB_STATES", "TERMINAL_STATES",
    "events_dir", "events_path", "make_event", "parse_event_line", "status_path", "DIST_BACKENDS",
    "DIST_BACKEND_ENV",
]

EVENT_SCHEMA_VERSION = 1
EVENT_KINDS = ("start", "step", "stage", "heartbeat", "checkpoint", "eval", "end", "error", "adapt")
JOB_STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "UNKNOWN")
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
# the collective backend the launcher asks the ranks to use, passed in their environment
DIST_BACKENDS = ("auto", "gloo", "nccl", "staged")
DIST_BACKEND_ENV = "WORKBENCH_DIST_BACKEND"
# a warm rank server's socket: ranks started with it set are forked from that server (workbench.runtime.warm)
WARM_RANKS_ENV = "WORKBENCH_WARM_RANKS"

CONFIG_FILE = "config.json"
COMMAND_FILE = "command.txt"
LAUNCH_FILE = "launch.json"
STATUS_FILE = "status.json"
LOGS_DIR = "logs"
CHECKPOINTS_DIR = "checkpoints"


def events_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "events"


def events_path(run_dir: str | Path, rank: int) -> Path:
    return events_dir(run_dir) / f"rank{rank}.jsonl"


def status_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / STATUS_FILE


def make_event(kind: str, rank: int, **fields: Any) -> dict[str, Any]:
    """A schema-conforming event record (not yet serialised)."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"event kind must be one of {EVENT_KINDS}, got {kind!r}")
    check_int("event rank", rank, 0)
    reserved = {"v", "kind", "t", "rank"} & set(fields)
    if reserved and not (reserved == {"t"}):
        raise ValueError(f"event fields {sorted(reserved)} are reserved")
    return {"v": EVENT_SCHEMA_VERSION, "kind": kind, "t": fields.pop("t", time.time()), "rank": rank, **fields}


def parse_event_line(line: str) -> dict[str, Any]:
    """Parse one JSONL line; raise ValueError for a corrupt or foreign line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"corrupt event line ({exc.msg} at column {exc.colno}): {line[:80]!r}") from None
    if not isinstance(record, dict) or "kind" not in record or "rank" not in record:
        raise ValueError(f"event line lacks 'kind'/'rank': {line[:80]!r}")
    if record.get("v") != EVENT_SCHEMA_VERSION:
        raise ValueError(f"event schema version {record.get('v')!r} is not {EVENT_SCHEMA_VERSION}: {line[:80]!r}")
    return record


def read_events(run_dir: str | Path, rank: int | None = None) -> list[dict[str, Any]]:
    """All event records of one rank (or of every rank, in rank order)."""
    paths = [events_path(run_dir, rank)] if rank is not None else sorted(
        events_dir(run_dir).glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]))
    records = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                records.append(parse_event_line(line))
    return records


def load_measured_timeline(run_dir: str | Path) -> Timeline:
    """Measured stage events of every rank on one clock (ms since the earliest ``t0``)."""
    stage_records = [r for r in read_events(run_dir) if r["kind"] == "stage"]
    if not stage_records:
        return Timeline((), {"run_dir": str(run_dir), "source": "measured"})
    origin = min(r["t0"] for r in stage_records)
    events = []
    for r in stage_records:
        shift = (r["t0"] - origin) * 1e3
        fields = {k: v for k, v in r.items() if k in Event.__dataclass_fields__}
        fields["rank"] = r["rank"]
        fields["start"] += shift
        fields["end"] += shift
        events.append(Event(**fields))
    marks = [{"time": (r["at"] - origin) * 1e3, "step": r["step"], "label": adaptation_text(r)}
             for r in read_events(run_dir) if r["kind"] == "adapt" and r.get("changed")]
    meta = {"run_dir": str(run_dir), "source": "measured", "t0": origin}
    return Timeline(tuple(events), {**meta, "marks": marks} if marks else meta)


def adaptation_text(record: dict[str, Any]) -> str:
    """``step 4: in flight 1/1 -> 2/1`` (and the mode change, if any) for one ``adapt`` record."""
    depths = lambda v: "/".join(map(str, v or ()))  # noqa: E731
    text = (f"step {record.get('step')}: in flight {depths(record.get('inflight_from'))} -> "
            f"{depths(record.get('inflight_to'))}")
    if record.get("mode_from") != record.get("mode_to"):
        text += f", {record.get('mode_from')} -> {record.get('mode_to')}"
    return text
