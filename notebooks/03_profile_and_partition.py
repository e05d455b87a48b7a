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
# # Profile a model, then cut it into pipeline stages
#
# A pipeline is as fast as its slowest stage. To cut a model well you need to
# know what each layer costs: its forward and backward time, the activation it
# hands to the next stage, and the memory it pins (weights, gradients,
# optimizer state, saved activations). Then the cut is an optimisation
# problem: choose $S-1$ boundaries in a chain of $L$ layers so that the
# slowest stage, counting the transfer into it, is as fast as possible, and
# every stage fits its device.
#
# This notebook profiles a ResNet-18 layer by layer on this machine, cuts it
# with AMPA (the automatic partitioner of GroPipe, exact; see the
# [glossary](../docs/glossary.md)) and with the classic
# baselines, projects the profile onto GPUs we do not have, and ends with the
# **partition editor**: move a boundary yourself and watch the bottleneck,
# the bubble, the iteration time and the memory move with it.

# %% tags=["parameters"]
# Parameters. WORKBENCH_SMOKE=1 (set by the test suite) profiles smaller images.
import os

smoke = os.environ.get("WORKBENCH_SMOKE") == "1"
model_name = "resnet18"
image_size = 64 if smoke else 128   # input images are image_size x image_size x 3
profile_batch = 16                  # samples one pipeline processes per iteration
num_stages = 3
num_microbatches = 8
run_root = os.environ.get("WORKBENCH_RUN_ROOT") or os.path.join(  # the project's runs/, from any folder
    next(d for d in (os.getcwd(), os.path.dirname(os.getcwd())) if os.path.isdir(os.path.join(d, "launch"))), "runs")

# %%
import torch

from workbench.models import build_model
from workbench.planning import get_cluster, partition
from workbench.profiling import profile
from workbench.viz.balance import balance_figure
from workbench.viz.profile import layer_cost_bars

torch.set_num_threads(1)  # a pipeline stage runs one thread per process here; profile like one

# %% [markdown]
# ## 1. Profile, layer by layer
#
# The model zoo gives every model as an ordered sequence of layers (for a
# ResNet: the stem, one unit per residual block, the head), the units a
# pipeline may cut between. The profiler runs each one the way a stage would
# (input arriving from a previous stage, backward starting from an incoming
# gradient), times forward and backward separately, counts FLOPs and the
# bytes autograd saves. Results are cached on disk, so running this again is
# instant.

# %%
sequence = build_model(model_name, image_size=image_size)
costs = profile(sequence, batch=profile_batch, progress=False)
total_ms = sum(l.forward_ms + l.backward_ms for l in costs.layers)
print(f"{costs.model}: {costs.num_layers} layers, {total_ms:.1f} ms per training pass at batch {costs.batch_size}")
for layer in costs.layers:
    print(f"  {layer.name:>14}: {layer.forward_ms + layer.backward_ms:7.2f} ms  {layer.flops / 1e9:6.2f} GFLOP  "
          f"weights {layer.param_bytes / 2**20:6.2f} MiB  output {layer.activation_bytes / 2**20:6.2f} MiB")
layer_cost_bars(costs, "time")

# %% [markdown]
# A ResNet keeps the work per block roughly level on purpose: each
# downsampling halves the feature map's height and width and doubles its
# channels. But the activation a block hands on shrinks at every
# downsampling while its weights grow fourfold, so the last blocks hold most
# of the weights and the first ones send the biggest tensors. "The same number
# of layers per stage", "the same weights per stage" and "the same time per
# stage" are three different cuts, and none of them counts the transfers.

# %%
layer_cost_bars(costs, "memory")

# %% [markdown]
# ## 2. Cut it: AMPA against the baselines
#
# Every partitioner returns the same kind of result, evaluated the same way
# (per-stage forward, backward and boundary-transfer time on this machine's
# links, memory per stage), so they compare directly:
#
# * `uniform`: the same number of layers per stage;
# * `params`: balanced weight bytes;
# * `time`: torchgpipe's block partition of the layer times (no communication);
# * `pipedream`: PipeDream's dynamic programme (a stage costs the larger of its compute and its input transfer);
# * `ampa`: GroPipe's exact min-max partition with communication and a memory cap.
#
# Which baseline comes close depends on the model, the machine and how
# steady the measurements were; AMPA is never worse under this cost model,
# because it is exact for it.

# %%
cluster = get_cluster("local-cpu")
results = {name: partition(costs, num_stages, name, num_microbatches=num_microbatches, cluster=cluster)
           for name in ("uniform", "params", "time", "pipedream", "ampa")}
ampa = results["ampa"]
print(f"{'algorithm':<10}{'partition':<22}{'slowest stage ms':>18}{'vs AMPA':>9}")
for name, result in results.items():
    print(f"{name:<10}{str(result.partition):<22}{result.bottleneck_ms:>18.2f}"
          f"{result.bottleneck_ms / ampa.bottleneck_ms:>9.2f}x")
balance_figure(ampa, title=f"AMPA: {ampa.partition}")

# %%
balance_figure(results["uniform"], title=f"uniform: {results['uniform'].partition}")

# %% [markdown]
# ## 3. The same model on GPUs we do not have
#
# FLOPs and bytes do not depend on the device, so the profile can be
# projected onto a datasheet device (a roofline: each pass takes the larger
# of its compute time and its memory time). On a V100 the balance shifts:
# the convolutions speed up far more than the memory-bound layers, so the
# best cut moves.

# %%
from workbench.profiling.projection import project

v100_cluster = get_cluster("8xV100-PCIe")
v100_costs = project(costs, v100_cluster.device)
v100_ampa = partition(v100_costs, num_stages, "ampa", num_microbatches=num_microbatches, cluster=v100_cluster)
print(f"this CPU: AMPA cuts {ampa.partition} (slowest stage {ampa.bottleneck_ms:.2f} ms)")
print(f"V100    : AMPA cuts {v100_ampa.partition} (slowest stage {v100_ampa.bottleneck_ms:.3f} ms)")
balance_figure(v100_ampa, title=f"Projected onto 8 x V100 (PCIe): AMPA's cut {v100_ampa.partition}")

# %% [markdown]
# ## 4. Move the boundaries yourself
#
# The editor starts at AMPA's cut. Each slider is one boundary (the first
# layer of the next stage). Move one and everything follows at once: the
# balance bars, the simulated 1F1B timeline, the bottleneck stage, the
# bubble, the iteration time, the peak memory and how far you are from
# AMPA's optimum. Three words the next lesson (`02_pipeline_schedules_explained`)
# builds up properly: the batch is cut into micro-batches that stream through
# the stages; **1F1B** is the order in which each stage runs their forward
# and backward passes (after a few forwards, one forward then one backward);
# the **bubble** is the share of the step a stage sits idle waiting for its
# neighbours; and the **timeline** is the simulator's replay of that order
# with the profiled costs, one lane per stage. Try to make the slowest stage
# faster than AMPA's: you cannot, it is exact for that. The iteration time is another matter
# (section 5).
# **Launch** would train the partition on the sliders as a real job (see
# `04_gropipe`).

# %%
from workbench.widgets.partition_editor import PartitionEditor

editor = PartitionEditor(costs, num_stages=num_stages, num_microbatches=num_microbatches, schedule="1f1b",
                         cluster="local-cpu", run_root=run_root)
at_ampa = editor.state
editor

# %% [markdown]
# The same move in code: shift the first boundary one layer later (stage 0
# takes one more block), and compare.

# %%
cuts = editor.cuts
moved_cuts = [cuts[0] + 1, *cuts[1:]] if cuts[0] + 1 < cuts[1] else [cuts[0] - 1, *cuts[1:]]
moved = editor.evaluate(type(at_ampa.partition).from_cuts(moved_cuts, costs.num_layers))
for label, state in (("AMPA's cut", at_ampa), ("moved", moved)):
    print(f"{label:>10}: {str(state.partition):<22} bottleneck {state.bottleneck_ms:7.2f} ms (stage "
          f"{state.bottleneck_stage}), bubble {state.bubble_fraction:6.1%}, iteration {state.iteration_ms:7.2f} ms, "
          f"gap to AMPA {state.gap:+.1%}")

# %% [markdown]
# ## 5. The slowest stage is not the whole iteration
#
# AMPA minimises the slowest stage (the bottleneck) among the cuts whose
# stages fit in memory. That is what sets a pipeline's pace once it is
# full: every micro-batch passes every stage, so the slowest one sets the
# rate. But an iteration also fills and drains the pipeline, and during the
# fill and the drain the other stages' times count too, and so do the
# transfers between stages. So a cut with a slightly slower bottleneck can
# simulate a shorter iteration. `shortest_iteration`
# (`workbench.lessons.partitioning`) has the editor evaluate every cut into
# `num_stages` stages and returns the one with the shortest simulated
# iteration; first this model (what it prints depends on this
# machine's profile), then a small model made up so that it happens.

# %%
from workbench.core.costs import LayerCost, ModelCosts
from workbench.lessons.partitioning import compare_cuts, shortest_iteration
from workbench.viz.timeline import timeline_figure

# every cut is evaluated; shortest_iteration raises if one had a faster bottleneck than AMPA's (it is exact)
print(compare_cuts(*shortest_iteration(editor)))

# %% [markdown]
# The made-up model has six layers; the first three hand big activations on
# (4 MiB each), the last three small ones.

# %%
made_up = ModelCosts("made-up", profile_batch, "synthetic", tuple(
    LayerCost(f"layer{i}", forward, backward, param_bytes=2**20, activation_bytes=activation, saved_bytes=2**20)
    for i, (forward, backward, activation) in enumerate([(2.6, 4.8, 2**22), (0.6, 5.8, 2**22), (1.5, 4.9, 2**22),
                                                          (2.9, 2.8, 2**16), (1.8, 2.4, 2**16), (2.0, 2.2, 2**16)])))
made_up_editor = PartitionEditor(made_up, num_stages=3, num_microbatches=num_microbatches, schedule="1f1b",
                                 cluster="local-cpu", models=[])
made_up_ampa, made_up_shortest = shortest_iteration(made_up_editor)
print(compare_cuts(made_up_ampa, made_up_shortest))
assert made_up_shortest.iteration_ms < made_up_ampa.iteration_ms  # the case the text describes
assert made_up_shortest.bottleneck_ms > made_up_ampa.bottleneck_ms
timeline_figure([made_up_ampa.sim.timeline, made_up_shortest.sim.timeline], compare="side",
                names=[f"AMPA's cut {made_up_ampa.partition}", f"shorter iteration {made_up_shortest.partition}"],
                title="The made-up model: the slowest stage against the whole iteration")

# %% [markdown]
# ## Exercises
#
# 1. **A floor under every cut.** No partition into $S$ stages can have a
#    slowest stage faster than the whole model's compute divided by $S$.
#    Predict how close AMPA comes to that floor on this model, then check.
# 2. **One more stage.** Predict AMPA's slowest stage with 4 stages instead
#    of 3: a quarter of the compute, or more? Check with `partition` and say
#    what keeps it above the floor.

# %% tags=["solution"]
# Exercise 1, one answer: the floor from AMPA's own per-stage times (micro-batch units, transfers left out).
compute_ms = sum(ampa.stage_forward_ms) + sum(ampa.stage_backward_ms)
floor = compute_ms / num_stages
print(f"floor {floor:.2f} ms, AMPA {ampa.bottleneck_ms:.2f} ms ({ampa.bottleneck_ms / floor:.2f}x the floor)")
assert ampa.bottleneck_ms >= floor - 1e-9

# %% tags=["solution"]
# Exercise 2, one answer: four stages; layers are indivisible and boundaries cost transfers.
four = partition(costs, num_stages + 1, "ampa", num_microbatches=num_microbatches, cluster=cluster)
four_floor = (sum(four.stage_forward_ms) + sum(four.stage_backward_ms)) / (num_stages + 1)
heaviest = max(l.forward_ms + l.backward_ms for l in costs.layers) * four.microbatch_size / profile_batch
print(f"{num_stages + 1} stages: {four.partition}, slowest stage {four.bottleneck_ms:.2f} ms against a floor of "
      f"{four_floor:.2f} ms; the heaviest single layer alone takes about {heaviest:.2f} ms")
assert four.bottleneck_ms >= four_floor - 1e-9

# %% [markdown]
# The checks: the profile covers every layer with positive times, AMPA's
# slowest stage is no slower than any baseline's (it is exact), its cut has a
# zero gap in the editor, and moving a boundary away from it changes the
# bottleneck and does not beat it.

# %%
assert costs.num_layers == len(sequence.layer_names) and all(l.forward_ms > 0 and l.backward_ms > 0 for l in costs.layers)
assert all(ampa.bottleneck_ms <= r.bottleneck_ms + 1e-9 for r in results.values()), {k: r.bottleneck_ms for k, r in results.items()}
assert v100_ampa.bottleneck_ms < ampa.bottleneck_ms
assert at_ampa.partition == ampa.partition and abs(at_ampa.gap) < 1e-9
assert moved.partition != at_ampa.partition and moved.gap >= -1e-9 and moved.bottleneck_ms != at_ampa.bottleneck_ms
print(f"partition lesson OK: AMPA {ampa.partition} at {ampa.bottleneck_ms:.2f} ms; "
      f"uniform is {results['uniform'].bottleneck_ms / ampa.bottleneck_ms:.2f}x slower; moving a cut costs {moved.gap:+.1%}")
