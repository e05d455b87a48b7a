"""Job commands: ``launch``, ``status``, ``logs`` and ``cancel``.

``workbench launch CONFIG.toml`` reads a run config whose optional
``[launch]`` table holds the launch settings (``nproc_per_node``,
``nnodes``, ``entry``, ``max_restarts``, ``run_root``, ``name``, ``env``,
``hosts``, ``dist_backend`` and a ``[launch.slurm]`` table); everything else
is the run config handed to the training entry. Flags override the table.
The other commands take ``RUN``: a run directory, or a run id under
``--run-root``. None of them imports torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .result import Result

_BACKENDS = ("local", "multinode", "slurm", "dryrun")


def _spec_from_toml(path: str, args: argparse.Namespace):
    from ..core.config import read_toml
    from ..jobs import LaunchSpec

    data = read_toml(path)
    launch = dict(data.pop("launch", {}))
    for flag, key in (("nproc", "nproc_per_node"), ("nnodes", "nnodes"), ("run_root", "run_root"), ("name", "name"),
                      ("entry", "entry"), ("max_restarts", "max_restarts")):
        value = getattr(args, flag)
        if value is not None:
            launch[key] = value
    if "name" not in launch and isinstance(data.get("name"), str):
        launch["name"] = data["name"]
    if "hosts" in launch:
        launch["hosts"] = tuple(launch["hosts"])
    try:
        return LaunchSpec(config=data, **launch)
    except TypeError as exc:
        raise ValueError(f"CONFIG [launch] table: {exc}; known keys are the LaunchSpec fields") from None


def _job(args: argparse.Namespace):
    from ..jobs import attach

    candidate = Path(args.run)
    if not (candidate / "launch.json").is_file():
        candidate = Path(args.run_root) / args.run
    if not (candidate / "launch.json").is_file():
        raise ValueError(f"RUN {args.run!r} is neither a run directory nor a run id under {args.run_root!r}")
    return attach(candidate)


def _launch(args: argparse.Namespace) -> Result:
    from ..jobs import launch

    spec = _spec_from_toml(args.config, args)
    job = launch(spec, backend=args.backend)
    data = {"run_id": job.run_id, "run_dir": str(job.run_dir), "handle": job.handle, "commands": job.commands}
    text = [f"launched {job.handle}", f"run dir: {job.run_dir}"]
    if args.backend == "dryrun":
        text += ["", *job.commands]
    if args.wait:
        status = job.wait()
        data["status"] = status.to_dict()
        text += ["", status.text()]
        return Result("\n".join(text), data, exit_code=0 if status.state == "SUCCEEDED" else 1)
    return Result("\n".join(text), data)


def _status(args: argparse.Namespace) -> Result:
    status = _job(args).status()
    return Result(status.text(), status.to_dict())


def _logs(args: argparse.Namespace) -> Result:
    job = _job(args)
    lines = job.logs(rank=args.rank, tail=args.tail, follow=args.follow)
    if args.follow and not args.json:
        for line in lines:
            print(line, flush=True)
        return Result("")
    lines = list(lines)
    return Result("\n".join(lines), {"run_id": job.run_id, "rank": args.rank, "lines": lines})


def _cancel(args: argparse.Namespace) -> Result:
    status = _job(args).cancel(grace_s=args.grace)
    return Result(status.text(), status.to_dict())


def _add_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run directory, or run id under --run-root")
    parser.add_argument("--run-root", default="runs", help="where run ids are looked up (default: runs)")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("launch", parents=[common], help="launch a run from a TOML config")
    p.add_argument("config", metavar="CONFIG.toml")
    p.add_argument("--backend", choices=_BACKENDS, default="local")
    p.add_argument("--nproc", type=int, help="processes per node (default: what the strategy needs)")
    p.add_argument("--nnodes", type=int)
    p.add_argument("--max-restarts", dest="max_restarts", type=int)
    p.add_argument("--entry", help="training module run by torchrun -m")
    p.add_argument("--run-root", dest="run_root")
    p.add_argument("--name")
    p.add_argument("--wait", action="store_true", help="block until the run ends; exit 1 unless it succeeded")
    p.set_defaults(handler=_launch)
    p = sub.add_parser("status", parents=[common], help="state of a run, per rank")
    _add_run(p)
    p.set_defaults(handler=_status)
    p = sub.add_parser("logs", parents=[common], help="console lines of a run")
    _add_run(p)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the run ends")
    p.add_argument("--rank", type=int, help="only this global rank's lines")
    p.add_argument("--tail", type=int, default=200, help="how many recent lines (default 200)")
    p.set_defaults(handler=_logs)
    p = sub.add_parser("cancel", parents=[common], help="stop a run and its whole process tree")
    _add_run(p)
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    p.set_defaults(handler=_cancel)

