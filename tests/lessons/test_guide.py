"""The strategy guide: each rule's verdict comes from the per-layer search, and the table shows a failing one."""

from workbench.core.hardware import DEVICES
from workbench.lessons.guide import GUIDE_SHAPES, Rule, _describe, check_rules, guide_table
from workbench.lessons.planner import option_runs
from workbench.planning.costs.analytic import transformer_costs
from workbench.planning.costs.clusters import load_cluster
from workbench.planning.strategy.hybrid import cost_plan


def test_every_rule_is_answered_with_the_planners_numbers():
    rules = check_rules()
    assert [r.advice for r in rules] == ["data parallelism", "ZeRO-2, then FSDP",
                                         "tensor parallelism inside a node, pipelines across nodes",
                                         "recompute some layers before adding stages"]
    assert all(r.holds for r in rules), [r.evidence for r in rules if not r.holds]
    assert "GiB of its 80 GiB" in rules[1].evidence and "x as fast" in rules[3].evidence
    table = guide_table(rules)
    assert table.count("\n") == 5 and table.count("| yes |") == 4


def test_a_rule_the_planner_disagrees_with_is_marked():
    table = guide_table([Rule("s", "a", False, "the numbers")])
    assert "| s | a | **no** | the numbers |" in table


def test_describe_reads_the_plans_shape():
    cluster = load_cluster("2x8xH100-IB")
    costs = transformer_costs(GUIDE_SHAPES["7B-class"], DEVICES["H100"], "7b")
    last = len(costs.layers) - 1
    estimate = cost_plan(costs, cluster, 256, f"pp2-1f1b-m16-tp1d8-L[0=zero2;1-{last - 1}=ddp.tp1d4.rc;{last}=ddp]")
    assert _describe(estimate) == ("2 pipeline stages of 8 devices, tensor parallelism 4, data parallelism 2, "
                                   "1 layers sharded, 32 recomputed")


def test_option_runs_groups_equal_neighbours():
    ddp, fsdp = {"dp_kind": "replicate"}, {"dp_kind": "fsdp"}
    runs = option_runs([ddp, ddp, fsdp, ddp])
    assert [(first, last) for first, last, _ in runs] == [(0, 1), (2, 2), (3, 3)]
    assert runs[0][2] != runs[1][2] and runs[0][2] == runs[2][2]
