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

# %% tags=["parameters"]
# Parameters. WORKBENCH_SMOKE=1 (set by the test suite) profiles smaller models.
import os

smoke = os.environ.get("WORKBENCH_SMOKE") == "1"
local_model = "gpt2-tiny"                                   # a transformer, so 2D tensor parallelism is an option
local_overrides = {"n_embd": 128, "n_layer": 4, "n_head": 4}
local_batch = 16                                            # global batch on this machine
local_world = 4                                             # processes (they share this machine's cores)
server_model = "vgg-tiny" if smoke else "vgg16"             # VGG-16 is what the GroPipe paper trained
server_batch = 64 if smoke else 256
server_cluster = "8xV100-PCIe"
memory_fraction = 0.6                                       # section 4's budget: this share of what dp8 needs

# %%
import torch

from workbench.models.zoo import build_model, get_entry
from workbench import ParallelPlan
from workbench.core.config import to_toml
from workbench.planning import plan, transformer_shape
from workbench.planning.clusters import load_cluster
from workbench.profiling import profile
from workbench.profiling.projection import project
from workbench.viz.plan import plan_breakdown_figure
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

# %%
local = plan(costs, "local", local_batch, world_size=local_world, shape=shape)
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
# you can put a measured run next to it (notebook 03 does that for GroPipe).

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
config = best_local.to_config(steps=20, model_overrides=local_overrides, data={"kind": "bytes-lm", "seq_len": 64})
print("plan:", config.plan.name, "| world size", config.world_size)
print(to_toml({"model": config.model, "global_batch": config.global_batch, "plan": config.plan.to_dict()}))

# %% [markdown]
# How far to trust these times? The profile timed each layer alone in one
# process; a run's ranks do the same work more slowly (the runtime around each
# micro-batch, four processes on two cores), and on this machine every
# strategy came out at about 0.4-0.8 of its measured time. Calibrating fixes
# most of that: launch a few steps of a pipeline (for example
# `plan(costs, "local", local_batch, world_size=4, strategies=["pp4-gpipe-m4"]).best.to_config(steps=9)`),
# then plan with `calibration=job.run_dir` (CLI: `--calibrate RUN_DIR`). The
# profile's compute is scaled by what that run's ranks measured
# (`workbench.planning.calibrate`). The runtime's extra work comes per
# micro-batch, so runs at two micro-batch sizes (`pp4-gpipe-m4` and
# `pp4-gpipe-m16`) fit a per-micro-batch cost, and the asynchronous pipeline,
# which binds a weight version to every forward, takes a run of its own
# (`async-1x4-m8`): pass them all, `calibration=[run_a, run_b, run_c]`.
# The tensor-parallel runtimes are families of their own too: run the grid
# (`tp2d-2x2-dp1`) at half and twice the batch you plan and pass those runs
# as well (with `shape=`); the planner takes off the communication it charges
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
server_device = load_cluster(server_cluster)[0].device
server_costs = project(profile(server_model, batch=8, repeats=1, progress=False), server_device)
server = plan(server_costs, server_cluster, server_batch, kinds=("dp", "gropipe", "pipeline", "async"),
              recompute=(False,), simulate_top=24)
dp = server["dp8"].estimate
gro = min((p for p in server.plans if p.strategy.family == "gropipe" and p.estimate.method == "simulated"),
          key=lambda p: p.estimate.iteration_ms)
print(f"{server_model} on {server_cluster}: dp8 {dp.iteration_ms:.1f} ms "
      f"(exposed all-reduce {dp.exposed_comm_ms:.1f} ms); best GroPipe {gro.name} {gro.estimate.iteration_ms:.1f} ms "
      f"-> predicted gain {dp.iteration_ms / gro.estimate.iteration_ms - 1:+.0%}")
plan_breakdown_figure(server.rows()[:12], selected=gro.name)

# %% [markdown]
# ## 4. When memory is the constraint
#
# With a per-device budget, strategies that cannot fit are listed with the
# reason (which stage needs how much). With `fine_grained=True` the planner
# also tries recomputing activations *per layer*, chosen by dynamic
# programming over the layers (Galvatron's method), so a pipeline can fit by
# recomputing only the layers that save the most memory per millisecond.

# %%
memory_cap_gib = round(memory_fraction * dp.memory_gib, 4)
try:
    tight = plan(server_costs, server_cluster, server_batch, memory_cap_gib=memory_cap_gib, fine_grained=True,
                 kinds=("dp", "gropipe", "pipeline"), recompute=(False,))
    print(f"{len(tight.plans)} plans fit {memory_cap_gib} GiB per device; best {tight.best.name}")
    for row in tight.infeasible[:3]:
        print(f"  does not fit: {row['name']}: {row['reason']}")
    nothing_fits = None
except ValueError as error:
    nothing_fits = str(error)
    print(nothing_fits)

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
    e = p.estimate
    assert abs(e.compute_ms + e.bubble_ms + e.exposed_comm_ms - e.iteration_ms) < 1e-6 * e.iteration_ms, p.name
    assert ParallelPlan.parse(p.name) == p.strategy
assert config.world_size == local_world and config.global_batch == local_batch
assert load_cluster("local")[0].shared_compute and load_cluster(server_cluster)[0].world_size == 8
assert dp.exposed_comm_ms > 0 and gro.estimate.iteration_ms > 0
if nothing_fits is not None:
    assert "closest is" in nothing_fits and "GiB over" in nothing_fits
else:
    assert all(p.estimate.memory_gib <= memory_cap_gib for p in tight.plans)
    assert "dp8" in {row["name"] for row in tight.infeasible}  # data parallelism needs the whole model per device
print(f"planner OK: {len(local.plans)} local plans (best {local.best.name}), {len(server.plans)} server plans")
