"""Run configs as TOML text: read a file, write a dict (the form ``launch/*.toml`` are written in).

Standard library only (``tomllib`` reads; the writer is here).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["read_toml", "to_toml"]


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file as a dict; a missing file or bad TOML is a ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"TOML cannot hold the number {value!r}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are TOML basic-string escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise ValueError(f"TOML cannot hold a {type(value).__name__}: {value!r}")


def to_toml(data: dict[str, Any], _prefix: str = "", *, sections: tuple[str, ...] = ()) -> str:
    """A dict of TOML-able values as TOML text: scalars first, then ``[tables]`` and ``[[arrays of tables]]``.

    Small (flat) tables without nested tables are written inline, the way
    ``mesh = { dp = 2, pp = 2 }`` reads best; the rest, and the top-level
    tables named in ``sections`` (a run config's ``[training]``, ...), as
    sections.
    """
    def is_table_list(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)

    def inline(v: Any, key: str = "") -> bool:
        return isinstance(v, dict) and len(v) <= 4 and not any(isinstance(x, (dict, list)) for x in v.values()) \
            and not (key in sections and not _prefix)

    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items()
             if not (isinstance(v, dict) and not inline(v, k)) and not is_table_list(v)]
    for key, value in data.items():
        name = f"{_prefix}{_toml_key(key)}"
        if isinstance(value, dict) and not inline(value, key):
            lines += ["", f"[{name}]", to_toml(value, f"{name}.").strip("\n")]
        elif is_table_list(value):
            for entry in value:
                lines += ["", f"[[{name}]]", to_toml(entry, f"{name}.").strip("\n")]
    return "\n".join(line for i, line in enumerate(lines) if line or (i and lines[i - 1])).strip("\n") + "\n"
