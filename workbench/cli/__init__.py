"""The ``workbench`` command line.

Each module in this package contributes subcommands through a
``register(subparsers, common)`` function; modules are discovered, so a new
command is one new file. A command's handler returns a :class:`Result`
(human text plus a JSON-able object); ``--json`` prints the object as one
line instead of the text. Bad input (any ``ValueError``) exits with status 2
and a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import pkgutil
import sys
from importlib import import_module
from typing import Callable, Sequence

from .result import Result

__all__ = ["Result", "main", "build_parser"]

Handler = Callable[[argparse.Namespace], Result]


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as a single line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="workbench", description="Hybrid-parallel training workbench.")
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one machine-readable JSON object instead of text")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if os.getcwd() not in sys.path:  # factories named in configs import from here, as under ``python -m``
        sys.path.insert(0, os.getcwd())
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as typed (a config written records it)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        result = handler(args)
    except ValueError as exc:
        reason = " ".join(str(exc).split())
        print(f"workbench {args.command}: error: {reason}", file=sys.stderr)
        if getattr(args, "json", False):
            print(json.dumps({"error": reason}))
        return 2
    try:
        if getattr(args, "json", False):
            print(json.dumps(result.data, default=str))
        elif result.text:
            print(result.text)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader (e.g. `| head`) went away: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return result.exit_code


