"""What a command handler returns, in a module of its own.

The package ``__init__`` discovers and imports every command module, so the
commands take :class:`Result` from here rather than from the ``__init__``:
otherwise the package and its commands would import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Result"]


@dataclass
class Result:
    """What a command produced: ``text`` for people, ``data`` for ``--json``."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0
