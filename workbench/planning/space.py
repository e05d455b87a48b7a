"""The hybrid strategy space: every way to spread one model over N devices.

A strategy fixes the parallel degrees and the options the runtimes support:
data parallelism (``dp``), GroPipe (``groups x stages`` pipelines with a
per-stage gradient all-reduce across the groups, delay 0 or 1), plain
pipelines and the asynchronous pipeline (with data parallel replicas), and
2D (``q x q``) or 1D tensor parallelism with data parallelism outside. Each
strategy has a short stable name used in tables, configs and the CLI::

    dp8                       8-way data parallel
    gropipe-2x4-1f1b-m8-d1    2 groups x 4 stages, 1F1B, 8 micro-batches, delay 1
    pp4-gpipe-m16             one 4-stage GPipe pipeline, 16 micro-batches
    async-2x4-m8              2 replicas of a 4-stage async pipeline, 8 micro-batches in flight
    tp2d-2x2-dp2              2 data-parallel copies of a 2x2 tensor grid
    tp1d-4-dp2                2 copies of 4-way Megatron tensor parallelism
    (+ "-rc" when activations are recomputed)

:func:`enumerate_strategies` lists the valid points for a world size and a
model shape; invalid combinations are not generated (and
:meth:`Strategy.check` explains why a hand-made one is invalid).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Iterable

__all__ = ["Strategy", "enumerate_strategies", "factorizations", "STRATEGY_KINDS"]

STRATEGY_KINDS = ("dp", "pipeline", "gropipe", "async", "tp2d", "tp1d")
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved")

_NAME_RE = re.compile(
    r"^(?:dp(?P<dp>\d+)"
    r"|gropipe-(?P<g>\d+)x(?P<gs>\d+)-(?P<gsched>gpipe|1f1b)-m(?P<gm>\d+)-d(?P<gd>[01])"
    r"|pp(?P<ps>\d+)-(?P<psched>gpipe|1f1b|interleaved)(?:-v(?P<pv>\d+))?-m(?P<pm>\d+)"
    r"|async-(?P<ar>\d+)x(?P<as>\d+)-m(?P<am>\d+)"
    r"|tp2d-(?P<q>\d+)x(?P<q2>\d+)-dp(?P<tdp>\d+)"
    r"|tp1d-(?P<t>\d+)-dp(?P<t1dp>\d+))"
    r"(?P<rc>-rc)?$"
)


@dataclass(frozen=True)
class Strategy:
    """One point of the strategy space.

    ``dp`` is the number of model replicas (GroPipe groups, pipeline replicas
    or data-parallel copies of a tensor grid); ``pp`` the pipeline stages;
    ``tp`` the ranks of one tensor-parallel unit (``q*q`` for 2D).
    """

    kind: str
    dp: int = 1
    pp: int = 1
    tp: int = 1
    schedule: str | None = None
    microbatches: int = 1
    delay: int = 0
    chunks: int = 1
    recompute: bool = False

    def __post_init__(self) -> None:
        if self.kind not in STRATEGY_KINDS:
            raise ValueError(f"strategy kind must be one of {STRATEGY_KINDS}, got {self.kind!r}")
        for name in ("dp", "pp", "tp", "microbatches", "chunks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"strategy {name} must be an int >= 1, got {v!r}")
        if self.delay not in (0, 1):
            raise ValueError(f"strategy delay must be 0 or 1, got {self.delay!r}")

    # -- derived ----------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def q(self) -> int:
        """Side of the 2D grid (tp2d only)."""
        return int(round(self.tp**0.5))

    @property
    def name(self) -> str:
        rc = "-rc" if self.recompute else ""
        if self.kind == "dp":
            return f"dp{self.dp}{rc}"
        if self.kind == "gropipe":
            return f"gropipe-{self.dp}x{self.pp}-{self.schedule}-m{self.microbatches}-d{self.delay}{rc}"
        if self.kind == "pipeline":
            v = f"-v{self.chunks}" if self.schedule == "interleaved" else ""
            return f"pp{self.pp}-{self.schedule}{v}-m{self.microbatches}{rc}"
        if self.kind == "async":
            return f"async-{self.dp}x{self.pp}-m{self.microbatches}{rc}"
        if self.kind == "tp2d":
            return f"tp2d-{self.q}x{self.q}-dp{self.dp}{rc}"
        return f"tp1d-{self.tp}-dp{self.dp}{rc}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> "Strategy":
        """The inverse of :attr:`name`."""
        m = _NAME_RE.match(name.strip()) if isinstance(name, str) else None
        if not m:
            raise ValueError(
                f"unknown strategy name {name!r}; expected e.g. 'dp8', 'gropipe-2x4-1f1b-m8-d1', 'pp4-1f1b-m8', "
                "'async-2x4-m8', 'tp2d-2x2-dp2', 'tp1d-4-dp2' (optionally ending in '-rc')"
            )
        g = {k: (int(v) if v and v.isdigit() else v) for k, v in m.groupdict().items()}
        rc = bool(g["rc"])
        if g["dp"] is not None:
            s = cls("dp", dp=g["dp"], recompute=rc)
        elif g["g"] is not None:
            s = cls("gropipe", dp=g["g"], pp=g["gs"], schedule=g["gsched"], microbatches=g["gm"], delay=g["gd"], recompute=rc)
        elif g["ps"] is not None:
            s = cls("pipeline", pp=g["ps"], schedule=g["psched"], microbatches=g["pm"], chunks=g["pv"] or 1, recompute=rc)
        elif g["ar"] is not None:
            s = cls("async", dp=g["ar"], pp=g["as"], schedule="async", microbatches=g["am"], recompute=rc)
        elif g["q"] is not None:
            if g["q"] != g["q2"]:
                raise ValueError(f"2D tensor grids are square; got {g['q']}x{g['q2']} in {name!r}")
            s = cls("tp2d", dp=g["tdp"], tp=g["q"] ** 2, recompute=rc)
        else:
            s = cls("tp1d", dp=g["t1dp"], tp=g["t"], recompute=rc)
        return s

    def check(self, *, num_layers: int, global_batch: int, num_heads: int | None = None,
              hidden: int | None = None) -> None:
        """Raise ValueError saying why this strategy cannot run this model."""
        if self.pp > num_layers:
            raise ValueError(f"{self.name}: {self.pp} stages for {num_layers} layers (at most {num_layers} stages)")
        per_replica, rem = divmod(global_batch, self.dp)
        if rem:
            raise ValueError(f"{self.name}: global batch {global_batch} does not split over {self.dp} replicas")
        if per_replica % self.microbatches:
            raise ValueError(
                f"{self.name}: {self.microbatches} micro-batches do not divide the per-replica batch {per_replica}"
            )
        if self.kind == "pipeline" and self.schedule == "interleaved":
            if self.pp * self.chunks > num_layers:
                raise ValueError(f"{self.name}: {self.pp * self.chunks} virtual stages for {num_layers} layers")
            if self.microbatches % self.pp:
                raise ValueError(f"{self.name}: interleaved 1F1B needs micro-batches divisible by {self.pp} stages")
        if self.kind in ("tp2d", "tp1d"):
            if self.recompute:
                raise ValueError(f"{self.name}: the tensor-parallel runtime does not recompute activations (recomputation "
                                 f"is offered for data parallelism and pipelines)")
            if num_heads is None or hidden is None:
                raise ValueError(f"{self.name}: tensor parallelism needs a transformer (heads and hidden size)")
            split = self.q if self.kind == "tp2d" else self.tp
            if self.kind == "tp2d" and self.q * self.q != self.tp:
                raise ValueError(f"{self.name}: a 2D grid needs a square number of ranks, got {self.tp}")
            if num_heads % split or hidden % split:
                raise ValueError(f"{self.name}: {num_heads} heads / hidden {hidden} are not divisible by {split}")
            if self.kind == "tp2d" and (global_batch // self.dp) % self.q:
                raise ValueError(f"{self.name}: per-grid batch {global_batch // self.dp} is not divisible by q={self.q}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}


def factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """All ordered ``parts``-tuples of positive ints whose product is ``n``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"world size must be an int >= 1, got {n!r}")
    if parts == 1:
        return [(n,)]
    out = []
    for d in range(1, n + 1):
        if n % d == 0:
            out.extend((d, *rest) for rest in factorizations(n // d, parts - 1))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_strategies(
    world_size: int,
    *,
    num_layers: int,
    global_batch: int,
    num_heads: int | None = None,
    hidden: int | None = None,
    kinds: Iterable[str] = STRATEGY_KINDS,
    microbatch_options: Iterable[int] | None = None,
    recompute_options: Iterable[bool] = (False,),
    max_microbatches: int = 64,
) -> list[Strategy]:
    """Every valid strategy for this world size and model shape.

    Micro-batch counts default to the powers of two (and the stage count)
    that divide the per-replica batch, up to ``max_microbatches``.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be an int >= 1, got {world_size!r}")
    kinds = tuple(kinds)
    unknown = set(kinds) - set(STRATEGY_KINDS)
    if unknown:
        raise ValueError(f"unknown strategy kinds {sorted(unknown)}; valid: {STRATEGY_KINDS}")
    candidates: list[Strategy] = []

    def mb_options(per_replica: int, stages: int) -> list[int]:
        if microbatch_options is not None:
            opts = sorted(set(microbatch_options))
        else:
            opts = sorted({2**k for k in range(0, 7)} | {stages, 2 * stages, 4 * stages})
        return [m for m in opts if m <= max_microbatches and per_replica % m == 0 and m >= 1]

    for rc in recompute_options:
        for dp, pp in factorizations(world_size, 2):
            if global_batch % dp:
                continue
            per_replica = global_batch // dp
            if pp == 1:
                if "dp" in kinds:
                    candidates.append(Strategy("dp", dp=dp, recompute=rc))
                continue
            if pp > num_layers:
                continue
            for m in mb_options(per_replica, pp):
                if "gropipe" in kinds and dp > 1:
                    for sched in ("gpipe", "1f1b"):
                        for delay in (0, 1):
                            candidates.append(Strategy("gropipe", dp=dp, pp=pp, schedule=sched, microbatches=m,
                                                       delay=delay, recompute=rc))
                if "pipeline" in kinds and dp == 1:
                    for sched in ("gpipe", "1f1b"):
                        candidates.append(Strategy("pipeline", pp=pp, schedule=sched, microbatches=m, recompute=rc))
                    if m % pp == 0 and 2 * pp <= num_layers:
                        candidates.append(Strategy("pipeline", pp=pp, schedule="interleaved", microbatches=m,
                                                   chunks=2, recompute=rc))
                if "async" in kinds:
                    candidates.append(Strategy("async", dp=dp, pp=pp, schedule="async", microbatches=m, recompute=rc))
        if num_heads is not None and hidden is not None and not rc:  # the tensor runtime does not recompute
            for dp, tp in factorizations(world_size, 2):
                if tp == 1 or global_batch % dp:
                    continue
                q = int(round(tp**0.5))
                if "tp2d" in kinds and q * q == tp:
                    candidates.append(Strategy("tp2d", dp=dp, tp=tp, recompute=rc))
                if "tp1d" in kinds:
                    candidates.append(Strategy("tp1d", dp=dp, tp=tp, recompute=rc))

    valid = []
    for s in candidates:
        try:
            s.check(num_layers=num_layers, global_batch=global_batch, num_heads=num_heads, hidden=hidden)
        except ValueError:
            continue
        valid.append(s)
    if not valid:
        raise ValueError(
            f"no valid strategy for world size {world_size}, {num_layers} layers and global batch {global_batch}: "
            f"the batch must split over the replicas (divisors of {world_size}: {_divisors(world_size)})"
        )
    return valid
