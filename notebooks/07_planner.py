# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     notebook_metadata_filter: kernelspec,jupytext,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Choosing a hybrid strategy with the planner
#
# For one model, one cluster and one global batch, which mix of data
# parallelism, pipelines (plain, asynchronous, GroPipe's groups) and 2D tensor
# parallelism is fastest, with how many micro-batches, and *why*? Trying every
# option for real costs hours; the planner answers in seconds from a profile.
#
# For each candidate it
#
# 1. cuts the layers into stages with **AMPA** under the per-device memory budget,
# 2. builds the **schedule** the runtime would execute (the very same value),
# 3. **simulates** it on the cluster's links (intra- vs inter-node, all-reduce vs
#    point-to-point, compute slowed where it overlaps communication),
# 4. reads off the iteration time, split into **compute**, pipeline **bubble** and
#    **exposed communication**, and the **memory** of the busiest device.
#
# Every candidate is a `ParallelPlan`: a device mesh (`dp` replicas x `pp`
# pipeline stages x tensor-parallel ranks), a pipeline schedule, the
# micro-batches, the partition and per-layer options. Plan names say what they
# are, and `ParallelPlan.parse` reads them back: `dp4` (4-way data parallel),
# `gropipe-2x2-1f1b-m4-d1` (2 groups of 2-stage 1F1B pipelines, 4 micro-batches,
# gradient all-reduce applied one iteration late), `async-2x2-m4` (asynchronous
# pipeline with weight stashing), `tp2d-2x2-dp1` (one 2 x 2 tensor grid); a
# `-rc` suffix recomputes every layer's activations.
#
# We plan twice: for **this machine** (4 processes sharing 2 CPU cores) and for
# an **8-GPU server** (8 x V100 on PCIe, like the GroPipe paper's).
#
# Every term is defined in the [glossary](../docs/glossary.md), with the lesson that teaches it.

# %% tags=["parameters"]
import os  # parameters; WORKBENCH_SMOKE=1 (set by the test suite) profiles smaller models

smoke = os.environ.get("WORKBENCH_SMOKE") == "1"
local_model = "gpt2-tiny"                                   # a transformer, so 2D tensor parallelism is an option
local_overrides = {"n_embd": 128, "n_layer": 4, "n_head": 4}
local_batch = 16                                            # global batch on this machine
local_world = 4                                             # processes (they share this machine's cores)
server_model = "vgg-tiny" if smoke else "vgg16"             # VGG-16 is what the GroPipe paper trained
server_batch = 64 if smoke else 256
server_cluster = "8xV100-PCIe"
memory_fraction = 0.6                                       # section 4's budget: this share of what dp8 needs
mix_model = "gpt2-tiny" if smoke else "gpt2-small"          # section 5: big vocabulary, small blocks
mix_overrides = ({"vocab_size": 50257, "n_embd": 256, "n_layer": 6, "n_head": 4, "seq_len": 128} if smoke else {})
mix_batch = 256
mix_fractions = (1.0, 0.5, 0.3, 0.2, 0.1)                   # section 5's budgets: shares of what pure DP needs

# %%
import torch
from IPython.display import Markdown, display

from workbench.models.zoo import build_model, get_entry
from workbench import ParallelPlan
from workbench.planning import Budget, SearchOptions, Workload, plan, transformer_shape
from workbench.planning.strategy.hybrid import search_hybrid
from workbench.planning.costs.clusters import load_cluster
from workbench.profiling import profile
from workbench.profiling.projection import project
from workbench.viz.plan import layer_option_text, layer_strip_figure, plan_breakdown_figure
from workbench.viz.timeline import timeline_figure

torch.set_num_threads(1)  # each training process runs one thread; profile like one of them

# %% [markdown]
# ## 1. Profile once
#
# Everything the planner knows about the model comes from one profile: per
# layer, forward and backward time at a batch, FLOPs, and the bytes of
# weights, activations and optimizer state. A transformer also gets its
# *shape* (hidden size, heads, layers), which the 2D / 1D tensor-parallel cost
# model needs.

# %%
costs = profile(build_model(local_model, **local_overrides), batch=local_batch, progress=False)
shape = transformer_shape({**get_entry(local_model).config(local_overrides), "seq_len": 64}, local_batch)
print(f"{costs.model}: {costs.num_layers} layers, "
      f"{sum(l.forward_ms + l.backward_ms for l in costs.layers):.1f} ms per training step at batch {local_batch}")

# %% [markdown]
# ## 2. This machine: 4 processes on 2 cores
#
# The `local` cluster is this machine: gloo links measured by the
# communication benchmark, and processes that time-share its cores. A rank
# computes slower the more threads of the node are runnable beside it: other
# ranks' compute, and the all-reduces and sends that work the CPU too. The
# simulator settles each rank's slowdown from the timeline itself (*processor
# sharing*), so a pipeline whose ranks wait in the bubble slows its neighbours
# less than data parallelism, whose ranks all compute at once. The table is
# ranked by predicted iteration time; `method` says whether a row was
# simulated or estimated in closed form.
#
# The question is put as typed values: a `Workload` (the profile, the global
# batch and the transformer's shape), the cluster, a `Budget` (memory per
# device, how many devices) and, where the defaults do not suit,
# `SearchOptions` (which strategies, how many to simulate, calibration).
# Because the ranks here share the cores, the budget's world size is an upper
# bound: plans on fewer ranks are ranked too, and a note says when one of them
# trains faster (`SearchOptions(fewer_ranks=False)` plans exactly that many).

# %%
local = plan(Workload(costs, local_batch, shape=shape), "local", Budget(world_size=local_world))
print(f"{local.searched} strategies in {local.elapsed_s:.2f} s; best: {local.best.name}")
local.table.head(10)[["rank", "name", "iteration_ms", "memory_gib", "compute_ms", "bubble_ms", "exposed_comm_ms",
                      "method"]]

# %% [markdown]
# Where does the time go? Each bar splits an iteration of the busiest rank into
# compute, bubble and exposed communication.

# %%
plan_breakdown_figure(local.rows()[:12], selected=local.best.name)

# %% [markdown]
# The best plan's simulated timeline: the same events a real run records, so
# you can put a measured run next to it (notebook 04 does that for GroPipe).

# %%
best_local = next(p for p in local.plans if p.timeline() is not None)
timeline_figure(best_local.timeline(), title=f"{best_local.name}: predicted iteration on this machine")

# %% [markdown]
# A plan is one call away from a launch: `to_config()` gives the run config
# the jobs room starts with `workbench.jobs.launch` (or `workbench run`). The
# config carries the plan (with the partition the planner found) as its
# `[plan]` table; saved as TOML (`config.save_toml(...)`), it reads like the
# files in `launch/`.

# %%
config = best_local.to_config(training={"steps": 20}, model={"overrides": local_overrides},
                              data={"kind": "bytes-lm", "seq_len": 64})
print("plan:", config.plan.name, "| world size", config.world_size)
print(config.to_toml(defaults=False))

# %% [markdown]
# How far to trust these times? The profile timed each layer alone in one
# process; a run's ranks do the same work more slowly (the runtime around each
# micro-batch, four processes on two cores), and on this machine every
# strategy came out at about 0.4-0.8 of its measured time. Calibrating fixes
# most of that: launch a few steps of a pipeline (for example
# `plan(Workload(costs, local_batch), "local", Budget(world_size=4), SearchOptions(strategies=["pp4-gpipe-m4"]))`
# and its `.best.to_config(training={"steps": 9})`), then plan with
# `SearchOptions(calibration=job.run_dir)` (CLI: `--calibrate RUN_DIR`). The
# profile's compute is scaled by what that run's ranks measured
# (`workbench.planning.costs.run_calibration`). The runtime's extra work comes per
# micro-batch, so runs at two micro-batch sizes (`pp4-gpipe-m4` and
# `pp4-gpipe-m16`) fit a per-micro-batch cost, and the asynchronous pipeline,
# which binds a weight version to every forward, takes a run of its own
# (`async-1x4-m8`): pass them all, `SearchOptions(calibration=[run_a, run_b, run_c])`.
# The tensor-parallel runtimes are families of their own too: run the grid
# (`tp2d-2x2-dp1`) at half and twice the batch you plan and pass those runs
# as well (with the workload's `shape=`); the planner takes off the communication it charges
# and scales what is left.
# `bench/RESULTS.md` compares ten calibrated predictions with measured runs.

# %% [markdown]
# ## 3. An 8-GPU server
#
# We do not have the server, so the profile taken here is *projected* onto
# the preset's GPU (a V100 PCIe card) from each layer's FLOPs and bytes
# (roofline; 3x3 convolutions at cuDNN's Winograd rate), and the planner uses
# the preset's PCIe links. Data parallelism all-reduces every weight once a
# step, overlapped with the backward pass (the overlap slows both, by the
# preset's `overlap_slowdown`); GroPipe all-reduces each stage's weights
# across fewer groups, behind the pipeline, but pays its bubble. Which wins
# depends on how much of the all-reduce the backward pass hides: GroPipe's
# case is strongest for models with big fully connected layers (VGG) and
# weakest for compact ones (ResNet). `bench/RESULTS.md` shows the gains at
# several all-reduce bandwidths.

# %%
server_device = load_cluster(server_cluster).device
server_costs = project(profile(server_model, batch=8, repeats=1, progress=False), server_device)
server = plan(Workload(server_costs, server_batch), server_cluster,
              options=SearchOptions(kinds=("dp", "gropipe", "pipeline", "async"), recompute=(False,),
                                    simulate_top=24))
dp = server["dp8"].estimate
gro = min((p for p in server.plans if p.plan.family == "gropipe" and p.estimate.method == "simulated"),
          key=lambda p: p.estimate.iteration_ms)
print(f"{server_model} on {server_cluster}: dp8 {dp.iteration_ms:.1f} ms "
      f"(exposed all-reduce {dp.exposed_comm_ms:.1f} ms); best GroPipe {gro.name} {gro.estimate.iteration_ms:.1f} ms "
      f"-> predicted gain {dp.iteration_ms / gro.estimate.iteration_ms - 1:+.0%}")
plan_breakdown_figure(server.rows()[:12], selected=gro.name)

# %% [markdown]
# The same ranking as a widget: `PlanExplorer` shows it, lets you pick a plan
# for its breakdown, per-layer strip and predicted timeline, and plans again
# with another cluster preset, global batch or memory cap when you press
# Plan (a bar shows how far the search has got; interrupting the kernel
# keeps the best plans so far).

# %%
from workbench.widgets import PlanExplorer

explorer = PlanExplorer(server_costs, server_cluster, server_batch, top=12, result=server,
                        options=SearchOptions(kinds=("dp", "gropipe", "pipeline", "async"), recompute=(False,),
                                              simulate_top=24))
explorer

# %% [markdown]
# ## 4. When memory is the constraint
#
# With a per-device budget, strategies that cannot fit are listed with the
# reason (which stage needs how much). With `SearchOptions(fine_grained=True)` the planner
# also tries recomputing activations *per layer*, chosen by dynamic
# programming over the layers (Galvatron's method), so a pipeline can fit by
# recomputing only the layers that save the most memory per millisecond.

# %%
memory_cap_gib = round(memory_fraction * dp.memory_gib, 4)
try:
    tight = plan(Workload(server_costs, server_batch), server_cluster, Budget(memory_cap_gib=memory_cap_gib),
                 SearchOptions(fine_grained=True, kinds=("dp", "gropipe", "pipeline"), recompute=(False,)))
    print(f"{len(tight.plans)} plans fit {memory_cap_gib} GiB per device; best {tight.best.name}")
    for row in tight.infeasible[:3]:
        print(f"  does not fit: {row['name']}: {row['reason']}")
    nothing_fits = None
except ValueError as error:
    nothing_fits = str(error)
    print(nothing_fits)

# %% [markdown]
# ## 5. Per-layer plans: when mixing wins
#
# Every plan so far gave all layers the same options. The per-layer search
# (`SearchOptions(fine_grained=True)`, or `workbench.planning.strategy.hybrid.search_hybrid`) gives
# each layer its own: data parallelism replicated (DDP), with sharded
# gradients and optimizer state (ZeRO-2) or fully sharded (FSDP), a
# tensor-parallel degree, and recomputation. A dynamic programme over the
# layers of each pipeline stage picks the fastest mix that fits the budget;
# around it the search tries pipeline degrees, micro-batch counts and
# partitions. The same search restricted to one option for all layers gives
# the templates it is compared with, costed the same way.
#
# A GPT-2 is a good case: its embedding and output head hold most of the
# parameters (a 50,257-word vocabulary) and little activation memory, while
# its blocks hold few parameters and many saved activations. We search it
# on the 8 x V100 server at budgets from all of what pure DP needs down to a
# tenth of it.

# %%
from workbench.lessons.planner import budget_sweep, gain_figure, mix_story

mix_device = load_cluster(server_cluster)
mix_costs = project(profile(build_model(mix_model, **mix_overrides) if mix_overrides else mix_model, batch=8,
                            repeats=1, progress=False), mix_device.device)
sweep, rows = budget_sweep(mix_costs, mix_device, mix_batch, mix_fractions)
for r in rows:
    print(f"budget {r.budget_gib:6.2f} GiB ({r.fraction:.0%} of pure DP's): per-layer {r.mix.iteration_ms:8.1f} ms, "
          f"best uniform {r.uniform.iteration_ms:8.1f} ms ({r.uniform.name[:40]}), gain {r.gain:+.1%}")
widest = max(rows, key=lambda r: r.gain)  # the budget where mixing gains most
gain_figure(rows)

# %%
story, changed = mix_story(widest, sweep[1.0].gain("uniform"), mix_costs)
display(Markdown(story))
best_mix, mix_layers = widest.mix, widest.mix.layers()
layer_strip_figure(mix_layers, stage_memory_gib=best_mix.breakdown()["stage_memory_gib"], budget_gib=widest.budget_gib,
                   title=f"{best_mix.name[:70]}")

# %% [markdown]
# ## 6. Which strategy should I use?
#
# Practitioners start from four rules of thumb. Each holds only under
# conditions, so here each is put to the per-layer search, on transformer
# shapes whose layers are costed from their FLOPs and bytes on the preset's
# GPU (no profile needed, so a 33B-class model plans here too). The last
# column is the planner's answer, computed when this cell runs; "no" would
# mean the rule fails on these numbers. The [glossary's
# guide](../docs/glossary.md#which-strategy-should-i-use) has the longer
# list, and `workbench plan` answers for your own model and cluster.

# %%
from workbench.lessons.guide import check_rules, guide_table

rules = check_rules()
display(Markdown(guide_table(rules)))

# %% [markdown]
# ## Exercises
#
# 1. **A bigger batch.** Double the server's global batch. Each GPU computes
#    twice as much per step while the gradients to all-reduce stay the same
#    size: predict what happens to the share of `dp8`'s step spent waiting for
#    its all-reduce, then check with `plan`.
# 2. **Delay 0 or delay 1.** Take the best GroPipe plan of section 3 and
#    plan it with both all-reduce delays. Predict which one exposes less
#    communication, and whether that makes it faster. Check.

# %% tags=["solution"]
# Exercise 1, one answer: the same bytes over twice the compute, so the exposed share falls.
def dp8_at(batch: int):
    return plan(Workload(server_costs, batch), server_cluster, options=SearchOptions(strategies=["dp8"]))["dp8"].estimate


shares = {b: (e.exposed_comm_ms / e.iteration_ms) for b, e in ((b, dp8_at(b)) for b in (server_batch, 2 * server_batch))}
print("dp8, share of the step waiting for the all-reduce: " + ", ".join(f"batch {b}: {v:.1%}" for b, v in shares.items()))
assert shares[2 * server_batch] <= shares[server_batch] + 1e-9

# %% tags=["solution"]
# Exercise 2, one answer: delay 1 applies the all-reduce one iteration late, behind the next iteration's compute.
from dataclasses import replace

names = {d: gro.plan.replace(pipeline=replace(gro.plan.pipeline, delay=d)).name for d in (0, 1)}
both = plan(Workload(server_costs, server_batch), server_cluster, options=SearchOptions(strategies=list(names.values())))
delays = {d: both[name].estimate for d, name in names.items()}
for d, e in delays.items():
    print(f"{names[d]}: {e.iteration_ms:.1f} ms a step, {e.exposed_comm_ms:.2f} ms of it exposed communication")
assert delays[1].exposed_comm_ms <= delays[0].exposed_comm_ms + 1e-9

# %% [markdown]
# ## Checks
#
# The cells below assert what this lesson showed: the ranking is ordered,
# every breakdown adds up, names parse back to their plans, configs are
# launchable, and the budget either fits something or says what comes closest.

# %%
simulated = [p for p in local.plans if p.estimate.method != "projected"]
assert [p.estimate.iteration_ms for p in simulated] == sorted(p.estimate.iteration_ms for p in simulated)
for p in local.plans + server.plans:
    e = p.estimate  # every breakdown adds up, every name parses back
    assert abs(e.compute_ms + e.bubble_ms + e.exposed_comm_ms - e.iteration_ms) < 1e-6 * e.iteration_ms, p.name
    assert ParallelPlan.parse(p.name) == p.plan

# %%
assert config.world_size == local_world and config.training.global_batch == local_batch
assert load_cluster("local").shared_compute and load_cluster(server_cluster).world_size == 8
assert dp.exposed_comm_ms > 0 and gro.estimate.iteration_ms > 0
assert explorer.result is server and explorer.strategy.value == server.best.name  # the widget shows this ranking
if nothing_fits is not None:
    assert "closest is" in nothing_fits and "GiB over" in nothing_fits
else:
    assert all(p.estimate.memory_gib <= memory_cap_gib for p in tight.plans)
    assert "dp8" in {row["name"] for row in tight.infeasible}  # data parallelism needs the whole model per device
print("ranking, breakdowns, names, configs and budgets OK")

# %%
for r in rows:  # the per-layer search never loses to a template it also costs
    assert r.mix.iteration_ms <= r.uniform.iteration_ms + 1e-9 and r.mix.memory_bytes <= r.budget_gib * 2**30 * (1 + 1e-9)
assert abs(sweep[1.0].gain("uniform")) < 0.01, "with pure DP's memory one option should be (nearly) enough"
assert widest.gain > 0.05 and widest.fraction < 1.0, "under a tight budget the mix should win clearly"
assert len({layer_option_text(l) for l in mix_layers}) > 1 and changed > 0, "the winning plan mixes options"
assert best_mix.memory_bytes <= widest.budget_gib * 2**30 * (1 + 1e-9)
assert all(rule.holds for rule in rules), [rule.evidence for rule in rules if not rule.holds]
print(f"planner OK: {len(local.plans)} local plans (best {local.best.name}), {len(server.plans)} server plans")
