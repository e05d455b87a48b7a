"""Generic helpers for the prose and tables the lessons print: lists in words, fixed-width text tables."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

_WIDTH = re.compile(r"^(?P<align>[<>^]?)(?P<width>\d*)")


def listing(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: items joined as a sentence lists them."""
    items = list(items)
    if len(items) < 3:
        return " and ".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def text_table(header: Sequence[str], rows: Iterable[Sequence[Any]], formats: Sequence[str]) -> str:
    """A fixed-width table: ``formats`` are format specs per column (``"<22"``, ``">9.3f"``); the header takes
    each column's alignment and width, without its precision or type."""
    if len(header) != len(formats):
        raise ValueError(f"{len(header)} column titles for {len(formats)} formats")
    head_specs = [_WIDTH.match(spec).group(0) for spec in formats]
    lines = ["".join(format(title, spec) for title, spec in zip(header, head_specs))]
    for row in rows:
        if len(row) != len(formats):
            raise ValueError(f"a row of {len(row)} values for {len(formats)} columns: {row!r}")
        lines.append("".join(format(value, spec) for value, spec in zip(row, formats)))
    return "\n".join(lines)
