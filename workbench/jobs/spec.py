"""What to launch: the run config, the processes, the place, and the cluster options.

A launch goes wrong most expensively after the processes have started (a
world size that does not match the plan surfaces as a hang in the first
collective; a Slurm option the cluster cannot honour surfaces an hour later
in the queue). So :class:`LaunchSpec` and :class:`SlurmOptions` check every
field when they are built, and :func:`check_launchable` checks what depends on
the machine (the entry module can be found with the spec's environment, the
world size matches what the plan's mesh needs) before a backend starts anything.
Every refusal is a ``ValueError`` naming the field, the value and the fix.

The spec is plain data: it round-trips through JSON (``spec.json`` in the run
directory) so a later kernel can rebuild the job handle from files alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from ..core.fields import (boolean, check_choice, check_int, from_dict, integer, is_int, is_number, number, optional, spec,
                          to_dict, tuple_of, validate)
from ..core.rundir import DIST_BACKENDS

__all__ = ["LaunchSpec", "SlurmOptions", "DEFAULT_ENTRY", "DIST_BACKENDS", "check_launchable", "check_run_configs",
           "check_entry_importable", "config_dict"]

DEFAULT_ENTRY = "workbench.runtime.entry"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_SLURM_TIME_RE = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class SlurmOptions:
    """``#SBATCH`` settings for the Slurm backend (one task per node running torchrun).

    ``requeue`` lets Slurm put the job back in the queue (``scontrol requeue``, a node failure,
    preemption) and run the batch script again; with ``training.resume`` the run then continues
    from its latest checkpoint. ``rdzv_port`` is the rendezvous port on the first node of a
    multi-node job (a one-node job takes a free port itself).
    """

    partition: str | None = None
    time: str = "01:00:00"
    account: str | None = None
    gpus_per_node: int = spec(0, integer(0))
    cpus_per_task: int | None = spec(None, optional(integer(1)))
    mem: str | None = None
    rdzv_port: int = spec(29400, integer(1024, 65535))
    setup: tuple[str, ...] = spec((), tuple_of())
    extra_sbatch: tuple[str, ...] = spec((), tuple_of())
    requeue: bool = spec(False, boolean())

    def __post_init__(self) -> None:
        if not isinstance(self.time, str) or not _SLURM_TIME_RE.match(self.time):
            raise ValueError(f"SlurmOptions.time must look like MM, HH:MM:SS or D-HH:MM:SS, got {self.time!r}")
        validate(self, "SlurmOptions.")
        for name in ("partition", "account", "mem"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value or any(c.isspace() for c in value)):
                raise ValueError(f"SlurmOptions.{name} must be a non-empty word without spaces or None, got {value!r}")
        for line in self.extra_sbatch:
            if not isinstance(line, str) or not line.startswith("--") or "\n" in line:
                raise ValueError(f"SlurmOptions.extra_sbatch entries must be single '--option=value' strings, "
                                 f"got {line!r}")
        for line in self.setup:
            if not isinstance(line, str) or "\n" in line:
                raise ValueError(f"SlurmOptions.setup entries must be single shell lines, got {line!r}")


@dataclass(frozen=True)
class LaunchSpec:
    """One launch: ``config`` run by ``nnodes`` x ``nproc_per_node`` processes of ``torchrun -m entry``.

    ``config`` is the run config (a ``RunConfig`` or a plain dict) written to
    ``config.json``; ``dist_backend`` is the collective backend the workers
    should use (``auto``: NCCL when each rank has a GPU of its own, gloo
    otherwise), passed to them as ``WORKBENCH_DIST_BACKEND``; ``env`` is
    added to the workers' environment;
    ``max_restarts`` lets torchrun restart all workers after a failure;
    ``hosts`` names the nodes of a multi-node launch (the first hosts the
    rendezvous); ``stall_after_s`` is the heartbeat age after which a running
    rank is reported ``STALLED``.
    """

    config: Any = field(default_factory=dict)
    nproc_per_node: int | None = None
    nnodes: int = spec(1, integer(1))
    entry: str = DEFAULT_ENTRY
    dist_backend: str = "auto"
    env: Mapping[str, str] = field(default_factory=dict)
    max_restarts: int = spec(0, integer(0))
    run_root: str = "runs"
    name: str = "run"
    hosts: tuple[str, ...] = spec((), tuple_of())
    rdzv_port: int | None = spec(None, optional(integer(1024)))
    slurm: SlurmOptions | None = None
    stall_after_s: float = spec(30.0, number(0, strict=True, expected="a number of seconds > 0"))
    python: str = sys.executable

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(f"LaunchSpec.name must be 1-64 letters, digits, '_', '.' or '-' (starting with a letter "
                             f"or digit), got {self.name!r}")
        if not isinstance(self.entry, str) or not _MODULE_RE.match(self.entry):
            raise ValueError(f"LaunchSpec.entry must be a dotted module name such as {DEFAULT_ENTRY!r}, "
                             f"got {self.entry!r}")
        validate(self, "LaunchSpec.")
        if self.nproc_per_node is None:
            object.__setattr__(self, "nproc_per_node", self._default_nproc())
        check_int("LaunchSpec.nproc_per_node", self.nproc_per_node, 1)
        check_choice("LaunchSpec.dist_backend", self.dist_backend, DIST_BACKENDS)
        if not isinstance(self.env, Mapping):
            raise ValueError(f"LaunchSpec.env must be a mapping of str to str, got {type(self.env).__name__}")
        env = {}
        for key, value in self.env.items():
            if not isinstance(key, str) or not _ENV_KEY_RE.match(key):
                raise ValueError(f"LaunchSpec.env key {key!r} is not a valid environment variable name")
            if not isinstance(value, (str, os.PathLike)) and not is_number(value):
                raise ValueError(f"LaunchSpec.env[{key!r}] must be a string, got {value!r}")
            env[key] = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "run_root", os.fspath(self.run_root))
        if self.hosts and len(self.hosts) != self.nnodes:
            raise ValueError(f"LaunchSpec.hosts lists {len(self.hosts)} hosts but nnodes is {self.nnodes}; "
                             f"give one host per node (the first hosts the rendezvous)")
        if isinstance(self.slurm, Mapping):
            object.__setattr__(self, "slurm", SlurmOptions(**self.slurm))
        if self.slurm is not None and not isinstance(self.slurm, SlurmOptions):
            raise ValueError(f"LaunchSpec.slurm must be SlurmOptions or None, got {type(self.slurm).__name__}")
        config_dict(self.config)

    def _default_nproc(self) -> int:
        needed = required_world_size(self.config, self.entry)
        if needed is None:
            return 1
        if needed % self.nnodes:
            raise ValueError(f"LaunchSpec.nproc_per_node: the strategy needs {needed} processes, which {self.nnodes} "
                             f"nodes cannot share evenly; set nnodes to a divisor of {needed}")
        return needed // self.nnodes

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def replace(self, **changes: Any) -> "LaunchSpec":
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(changes)
        return LaunchSpec(**data)

    def to_dict(self) -> dict[str, Any]:
        return {**to_dict(self), "config": config_dict(self.config)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LaunchSpec":
        return from_dict(cls, data, "LaunchSpec.")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def config_dict(config: Any) -> dict[str, Any]:
    """The run config as a JSON-able dict (``RunConfig.to_dict()`` or a dict)."""
    if isinstance(config, Mapping):
        data = dict(config)
    elif hasattr(config, "to_dict"):
        data = config.to_dict()
    else:
        raise ValueError(f"LaunchSpec.config must be a RunConfig or a dict, got {type(config).__name__}")
    try:
        json.dumps(data)
    except TypeError as exc:
        raise ValueError(f"LaunchSpec.config must be JSON-serialisable: {exc}") from None
    return data


def _run_config_class():
    try:
        from ..core.config import RunConfig
    except ImportError:
        return None
    return RunConfig


def required_world_size(config: Any, entry: str) -> int | None:
    """Processes the plan in ``config`` needs (its mesh's size), or None when the config does not say.

    A ``RunConfig`` (or a dict for the default entry, parsed as one when the
    class is available) answers with its ``world_size`` and validates itself
    on the way; another entry's dict may carry a ``world_size`` key.
    """
    run_config = _run_config_class()
    if run_config is not None and isinstance(config, run_config):
        return int(config.world_size)
    if isinstance(config, Mapping):
        if entry == DEFAULT_ENTRY and run_config is not None:
            return int(run_config.from_dict(dict(config)).world_size)
        value = config.get("world_size")
        if is_int(value):
            return value
        return None
    if hasattr(config, "world_size"):
        return int(config.world_size)
    return None


def check_launchable(spec: LaunchSpec, *, check_entry: bool = True) -> None:
    """Refuse, before anything starts, a spec that cannot run here."""
    needed = required_world_size(spec.config, spec.entry)
    if needed is not None and needed != spec.world_size:
        hint = (f"set nproc_per_node={needed // spec.nnodes}" if needed % spec.nnodes == 0
                else f"use nnodes that divides {needed}")
        raise ValueError(f"LaunchSpec.nproc_per_node: world size {spec.nnodes} x {spec.nproc_per_node} = "
                         f"{spec.world_size} does not match the {needed} processes the strategy needs; {hint}")
    _check_restarts_resume(spec)
    if check_entry:
        check_entry_importable(spec)
        check_run_configs([spec])


def _needs_model_check(config: Any) -> bool:
    """Whether launching must build the model first: a factory, a dataset, overrides, a pipeline (its stages
    need as many layers, its explicit partition must fit them) or a schedule built from the stages' costs under
    a memory limit (a zoo model on built-in data with defaults and no stages cannot fail the preflight's
    checks, so it skips the subprocess)."""
    plan = config.plan
    return bool(config.model.from_factory or config.data.is_dataset or config.model.overrides
                or plan.num_virtual_stages > 1
                or (plan.pipeline.uses_costs and getattr(plan.pipeline, "memory_limit_mb", 0)))


def check_run_configs(specs: list[LaunchSpec]) -> None:
    """The default entry's model, partition and data, checked by the interpreter and environment of the ranks.

    ``workbench.runtime.preflight`` imports the factories, builds the model
    and runs two samples through it in a child process, so a factory that
    imports in the notebook but not in the run's processes is refused too.
    The specs (one launch, or the runs of a sweep, which share interpreter
    and environment) are checked in one such process.
    """
    run_config = _run_config_class()
    if run_config is None:
        return
    checked = {index: spec.config if isinstance(spec.config, run_config)
               else run_config.from_dict(config_dict(spec.config))
               for index, spec in enumerate(specs) if spec.entry == DEFAULT_ENTRY}
    checked = {index: config for index, config in checked.items() if _needs_model_check(config)}
    if not checked:
        return
    positions, configs = list(checked), list(checked.values())
    env = {**os.environ, **specs[0].env}
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for index, config in enumerate(configs):
            paths.append(Path(folder) / f"config{index}.json")
            paths[-1].write_text(json.dumps(config_dict(config)))
        out = subprocess.run([specs[0].python, "-m", "workbench.runtime.preflight", *map(str, paths)], env=env,
                             capture_output=True, text=True, timeout=600, cwd=os.getcwd())
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        line = lines[-1] if lines else ""
        if out.returncode == 2 and len(configs) > 1 and line.startswith("run "):  # its position among the specs
            position, _, line = line[4:].partition(": ")
            line = f"run {positions[int(position)]}: {line}"
        elif out.returncode == 2 and len(specs) > 1:
            line = f"run {positions[0]}: {line}"
        raise ValueError(line if lines and out.returncode == 2 else
                         f"the run config could not be checked by {specs[0].python} (exit {out.returncode}): "
                         f"{line or 'no output'}")


def _check_restarts_resume(spec: LaunchSpec) -> None:
    """Restarts of the default entry only help when the run resumes from its checkpoints."""
    run_config = _run_config_class()
    if not spec.max_restarts or spec.entry != DEFAULT_ENTRY or run_config is None:
        return
    config = spec.config if isinstance(spec.config, run_config) else run_config.from_dict(config_dict(spec.config))
    if not config.training.resume:
        raise ValueError(f"LaunchSpec.max_restarts is {spec.max_restarts} but the run config has [training] resume = "
                         f"false, so a restarted attempt would start again from step 0; set resume = true in the "
                         f"config's [training] (and checkpoint_every > 0), or max_restarts = 0")


def check_entry_importable(spec: LaunchSpec) -> None:
    env = {**os.environ, **spec.env}
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"
    try:
        out = subprocess.run([spec.python, "-c", probe, spec.entry], env=env, capture_output=True, text=True,
                             timeout=60)
    except FileNotFoundError:
        raise ValueError(f"LaunchSpec.python {spec.python!r} does not exist; give a Python interpreter path") from None
    if out.returncode != 0:
        detail = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "module not found"
        raise ValueError(f"LaunchSpec.entry {spec.entry!r} cannot be imported by {spec.python} ({detail}); install "
                         f"the package or add its folder to LaunchSpec.env['PYTHONPATH']")


def resolve_run_root(spec: LaunchSpec) -> Path:
    return Path(spec.run_root).expanduser().resolve()
