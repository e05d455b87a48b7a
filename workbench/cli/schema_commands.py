"""``workbench schema [--out FILE]``: the JSON Schema of a run config, for editors that validate TOML."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .result import Result


def _schema(args: argparse.Namespace) -> Result:
    from ..core.schema import run_config_schema

    schema = run_config_schema()
    text = json.dumps(schema, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
        return Result(f"wrote the run config's JSON Schema to {args.out} (first line of a TOML file: "
                      f"#:schema {args.out})", {"path": args.out})
    return Result(text, schema)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("schema", parents=[common], help="the run config's JSON Schema (editors validate and "
                                                        "complete TOML files with it)")
    p.add_argument("--out", help="write it to this file instead of printing it")
    p.set_defaults(handler=_schema)
