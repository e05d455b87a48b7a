"""One figure style: every figure colours an op as ``viz.style`` says, and lists ranks from rank 0 down."""

import ast
import re
from pathlib import Path

import pytest

import workbench
from workbench.core.costs import ModelCosts
from workbench.core.ir import Op
from workbench.core.timeline import Event, Timeline
from workbench.viz.balance import balance_figure
from workbench.viz.job_figures import job_summary_figure, timeline_figure_pair
from workbench.viz.plan import plan_breakdown_figure
from workbench.viz.profile import layer_cost_bars
from workbench.viz.style import CATEGORY_COLORS, IDLE, OP_COLORS, PALETTE, category_of, op_color
from workbench.viz.timeline import timeline_figure

from figure_checks import assert_style_colours, lanes_top_to_bottom, rank_lanes

NUM_RANKS = 12  # past 10, so lanes sorted as text ("rank 10" < "rank 2") would show
RANKS = [f"rank {r}" for r in range(NUM_RANKS)]


def run(source: str = "simulated", scale: float = 1.0) -> Timeline:
    """Every rank: forward, send, backward, all-reduce, optimizer step; the last rank starts first."""
    events = []
    for r in range(NUM_RANKS):
        t = float(NUM_RANKS - 1 - r)
        for op, start, end in (("F", 0, 1), ("SEND_F", 1, 1.5), ("B", 2, 4), ("AR", 4, 5), ("STEP", 5, 5.5)):
            events.append(Event(rank=r, stage=r, op=op, start=scale * (t + start), end=scale * (t + end),
                                microbatch=None if op in ("AR", "STEP") else 0, source=source,
                                peer=(r + 1) % NUM_RANKS if op == "SEND_F" else None))
    return Timeline(tuple(events))


SIMULATED, MEASURED = run(), run("measured", 1.2)


def test_style_gives_every_op_and_idle_one_colour():
    assert set(OP_COLORS) == {op.value for op in Op} | {IDLE}
    assert all(op_color(op.value) == CATEGORY_COLORS[category_of(op.value)] for op in Op)
    assert len(set(CATEGORY_COLORS.values())) == len(CATEGORY_COLORS)  # categories are told apart
    assert op_color("SEND_F") == op_color("RECV_B") and op_color("STASH") == op_color("RESTORE")
    with pytest.raises(ValueError, match="unknown op"):
        op_color("X")


@pytest.mark.parametrize("build", [
    lambda: timeline_figure(SIMULATED),
    lambda: timeline_figure([SIMULATED, MEASURED]),
    lambda: timeline_figure_pair(MEASURED, SIMULATED),
    lambda: timeline_figure_pair(MEASURED),
], ids=["single", "overlay", "job pair", "measured only"])
def test_ranks_are_listed_top_to_bottom_from_rank_0(build):
    fig = build()
    assert rank_lanes(fig) == RANKS
    assert lanes_top_to_bottom(fig)[:2] == ["rank 0", "rank 0 comm"]  # a rank's communication right under it


def test_side_by_side_and_summary_panels_list_ranks_from_rank_0_too():
    side = timeline_figure([SIMULATED, MEASURED], compare="side")
    assert rank_lanes(side) == rank_lanes(side, "yaxis2") == RANKS
    summary = job_summary_figure({"metrics": {}}, measured=MEASURED, simulated=SIMULATED)
    assert rank_lanes(summary, "yaxis3") == RANKS  # the timeline panel
    assert not any(t.showlegend for t in summary.data if t.type == "bar")  # the curves own the legend


def test_overlay_puts_the_prediction_on_top_of_each_lane():
    fig = timeline_figure_pair(MEASURED, SIMULATED)
    bars = {t.name: t for t in fig.data}
    assert bars["forward (simulated)"].offset > bars["forward (measured)"].offset


def test_every_timeline_figure_colours_ops_from_style():
    drawn = [timeline_figure(SIMULATED), timeline_figure([SIMULATED, MEASURED], compare="side"),
             timeline_figure_pair(MEASURED, SIMULATED),
             job_summary_figure({"metrics": {}}, measured=MEASURED, simulated=SIMULATED)]
    for fig in drawn:
        assert assert_style_colours(fig) == {"forward", "backward", "send/recv", "all-reduce", "optimizer", IDLE}


def test_other_figures_use_the_same_op_colours():
    balance = {t.name: t.marker.color for t in balance_figure({"forward_ms": [1.0], "backward_ms": [2.0],
                                                               "comm_ms": [0.5]}).data}
    assert (balance["forward"], balance["backward"], balance["boundary transfer"]) == (
        op_color("F"), op_color("B"), op_color("SEND_F"))
    profile = {t.name: t.marker.color for t in layer_cost_bars(ModelCosts.uniform(3), "time").data}
    assert (profile["forward"], profile["backward"]) == (op_color("F"), op_color("B"))
    plan = {t.name: t.marker.color for t in plan_breakdown_figure(
        [{"name": "a", "compute_ms": 1.0, "bubble_ms": 0.5, "exposed_comm_ms": 0.2, "memory_gib": 1.0}]).data}
    assert (plan["bubble"], plan["exposed communication"]) == (op_color(IDLE), op_color("AR"))


def test_figures_share_the_layout_defaults():
    for fig in (timeline_figure(SIMULATED), job_summary_figure({"metrics": {}}, measured=MEASURED),
                balance_figure({"compute_ms": [1.0]}), layer_cost_bars(ModelCosts.uniform(2))):
        assert fig.layout.template.layout.plot_bgcolor == "white"
        assert tuple(fig.layout.colorway) == PALETTE


# -- no second colour map --------------------------------------------------------------------------------
PACKAGE = Path(workbench.__file__).parent
STYLE = PACKAGE / "viz" / "style.py"
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p != STYLE)
_COLOUR = re.compile(r"(#(?:[0-9a-fA-F]{3}){1,2}|rgba?\(.*\))\Z")
_OP_KEYS = set(OP_COLORS) | set(CATEGORY_COLORS)


def _is_colour(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(_COLOUR.match(node.value))


def _colour_maps(tree: ast.AST) -> list[int]:
    """Lines of dicts keyed by an op with a colour value, and of collections of two or more colours."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            colours = sum(map(_is_colour, node.values))
            if (keys & _OP_KEYS and colours) or colours >= 2:
                found.append(node.lineno)
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)) and sum(map(_is_colour, node.elts)) >= 2:
            found.append(node.lineno)
    return found


def test_no_module_but_style_holds_a_colour_map():
    offenders = {str(p.relative_to(PACKAGE)): lines for p in SOURCES
                 if (lines := _colour_maps(ast.parse(p.read_text(), str(p))))}
    assert offenders == {}, "colour maps belong in workbench/viz/style.py"


def test_no_module_but_style_spells_an_op_colour():
    colours = {c.lower() for c in CATEGORY_COLORS.values()}
    offenders = {str(p.relative_to(PACKAGE)): sorted(found) for p in SOURCES
                 if (found := colours & {m.lower() for m in re.findall(r"#[0-9a-fA-F]{6}", p.read_text())})}
    assert offenders == {}, "take op colours from workbench.viz.style, do not copy them"


def test_a_split_backward_draws_its_input_and_weight_gradients_in_their_own_colours():
    from workbench.core.plan import ParallelPlan
    from workbench.scheduling.registry import schedule_for
    from workbench.scheduling.simulate import simulate
    from workbench.scheduling.stagecosts import StageCosts

    result = simulate(schedule_for(ParallelPlan.parse("pp3-zbh1-m4")), StageCosts.uniform(3))
    fig = timeline_figure(result.timeline)
    assert {"input-grad", "weight-grad"} <= assert_style_colours(fig)
    assert len({op_color("B"), op_color("I"), op_color("W")}) == 3
