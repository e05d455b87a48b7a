"""What a timeline figure shows, read back from its plotly layout (shared by tests/viz and tests/widgets).

plotly draws the first entry of a y axis' ``categoryarray`` at the bottom
unless the axis is reversed, and appends lanes missing from the array in the
order the bars name them; reading the order back the way plotly does is what
catches ranks drawn upside down.
"""

from workbench.viz.style import CATEGORY_COLORS


def lanes_top_to_bottom(fig, axis: str = "yaxis") -> list[str]:
    """The categories of y axis ``axis`` ("yaxis", "yaxis2", ...) of ``fig`` as drawn, from the top."""
    layout_axis, ref = fig.layout[axis], axis.replace("axis", "")
    assert layout_axis.categoryorder == "array", "the lanes must be ordered explicitly, not by first appearance"
    order = list(layout_axis.categoryarray)
    drawn = {y for t in fig.data if t.type == "bar" and (t.yaxis or "y") == ref for y in t.y}
    assert drawn <= set(order), f"bars on lanes the axis does not order: {sorted(drawn - set(order))}"
    return order if layout_axis.autorange == "reversed" else order[::-1]


def rank_lanes(fig, axis: str = "yaxis") -> list[str]:
    """The compute lanes (one per rank), from the top."""
    return [lane for lane in lanes_top_to_bottom(fig, axis) if not lane.endswith(" comm")]


def assert_style_colours(fig) -> set[str]:
    """Every timeline bar has its category's colour from ``viz.style``; returns the categories drawn."""
    seen = set()
    for trace in fig.data:
        if trace.type != "bar":
            continue
        category = trace.name.rsplit(" (", 1)[0]
        assert trace.marker.color == CATEGORY_COLORS[category], trace.name
        seen.add(category)
    return seen
