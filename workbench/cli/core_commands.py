"""Commands over the core values: ``info``, ``topology`` and ``action``."""

from __future__ import annotations

import argparse
import platform
import sys

from ..core import Topology, parse_action
from .result import Result


def _info(args: argparse.Namespace) -> Result:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for pkg in ("workbench", "torch", "torchvision", "transformers", "plotly", "ipywidgets", "jupyterlab"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    data = {"python": platform.python_version(), "platform": sys.platform, "packages": versions}
    text = "\n".join([f"{'python':<13} {data['python']} ({data['platform']})"]
                     + [f"{k:<13} {v or 'not installed'}" for k, v in versions.items()])
    return Result(text, data)


def _topology(args: argparse.Namespace) -> Result:
    topo = Topology.parse(args.axes)
    groups = {axis: topo.groups(axis) for axis in topo.names}
    data = {
        "axes": dict(topo.axes),
        "world_size": topo.world_size,
        "ranks": [topo.coords(r) for r in range(topo.world_size)],
        "groups": groups,
    }
    lines = [f"{topo}  (world size {topo.world_size})", "", topo.describe(), ""]
    lines += [f"{axis} groups: {g}" for axis, g in groups.items()]
    return Result("\n".join(lines), data)


def _action(args: argparse.Namespace) -> Result:
    actions = [parse_action(t) for t in args.actions]
    data = {"actions": [a.to_dict() for a in actions]}
    return Result("\n".join(f"{str(a):<14} {a.to_dict()}" for a in actions), data)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("info", parents=[common], help="versions of the workbench and its stack")
    p.set_defaults(handler=_info)
    p = sub.add_parser("topology", parents=[common], help="rank coordinates and groups of a parallel layout")
    p.add_argument("axes", help="axes and sizes, slowest first, e.g. 'dp=2,pp=2'")
    p.set_defaults(handler=_topology)
    p = sub.add_parser("action", parents=[common], help="parse schedule actions from their text form")
    p.add_argument("actions", nargs="+", help="actions such as 1F3 0SEND_F3>1 0AR")
    p.set_defaults(handler=_action)
