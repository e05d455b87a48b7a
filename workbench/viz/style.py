"""Shared colours and names for schedule figures, so every view reads the same.

Forward work is blue, backward green (its weight-gradient half a lighter
green), point-to-point communication orange, gradient all-reduce red,
optimizer steps and weight stashing grey, and idle time a pale grey that is
drawn explicitly so bubbles are visible rather than blank.
"""

from __future__ import annotations

__all__ = ["CATEGORY_COLORS", "CATEGORY_ORDER", "category_of", "MEASURED_OPACITY"]

CATEGORY_COLORS = {
    "forward": "#4C78A8",
    "backward": "#54A24B",
    "weight-grad": "#9BD18B",
    "send/recv": "#F58518",
    "all-reduce": "#E45756",
    "step": "#7F7F7F",
    "idle": "#E8E8E8",
}
CATEGORY_ORDER = tuple(CATEGORY_COLORS)
MEASURED_OPACITY = 0.55

_OP_CATEGORY = {
    "F": "forward", "B": "backward", "I": "backward", "W": "weight-grad",
    "SEND_F": "send/recv", "RECV_F": "send/recv", "SEND_B": "send/recv", "RECV_B": "send/recv",
    "AR": "all-reduce", "STEP": "step", "STASH": "step", "RESTORE": "step",
}


def category_of(op: str) -> str:
    """The colour category of an event op (``"F"`` -> ``"forward"``)."""
    if op not in _OP_CATEGORY:
        raise ValueError(f"unknown op {op!r}; known: {sorted(_OP_CATEGORY)}")
    return _OP_CATEGORY[op]
