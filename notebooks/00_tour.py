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
# # A tour of the workbench
#
# Training a model that does not fit one device means splitting it, and there
# are many ways to split: copy the model and split the batch (data parallel),
# cut the layers into stages and stream micro-batches through them (pipeline
# parallel), or split each weight matrix over a grid of devices (2D tensor
# parallel). Real jobs mix them. Which mix is fastest, and why?
#
# This workbench is a place to answer that question with your hands on the
# controls. Below, a real 2-process pipeline run as the job monitor shows it
# (loss, throughput, the ranks' log, and the latest measured iteration over
# the simulator's prediction):
#
# ![The job monitor during a 2-rank 1F1B run: loss and throughput curves, the log, and a measured pipeline timeline over its prediction](../docs/monitor.png)
#
# From a notebook the workbench
#
# 1. **profiles** a model layer by layer (time, FLOPs, parameter, activation and optimizer bytes),
# 2. **partitions** it into pipeline stages,
# 3. **schedules and simulates** pipelines (GPipe, 1F1B, interleaved, asynchronous, GroPipe) and draws the bubbles,
# 4. **plans** hybrid strategies with a cost model, and
# 5. **launches real `torchrun` jobs** whose measured timelines come back next to the prediction.
#
# Everything rests on a handful of small values from `workbench.core`. They
# are plain Python (no torch), so the simulator and the planner run in any
# kernel, instantly. This tour meets them one at a time:
#
# | value | what it says |
# |---|---|
# | `Action` | one instruction for one rank: "stage 1, forward of micro-batch 3" is `1F3` |
# | `Schedule` | what every rank does, step by step; an idle step is a bubble |
# | `Partition` | which contiguous layers each pipeline stage owns |
# | `Topology` | how ranks are laid out on named axes (`dp`, `pp`, ...) and who talks to whom |
# | `Event`, `Timeline` | what ran where and when, simulated or measured |

# %% tags=["parameters"]
# Parameters. Notebooks read small sizes when WORKBENCH_SMOKE=1 (the test suite
# sets it); this tour is small already, so its only parameter is where the
# Chrome trace of section 5 is written.
import os
from pathlib import Path

project = next(d for d in (Path.cwd(), *Path.cwd().parents) if (d / "launch").is_dir())
trace_dir = Path(os.environ.get("WORKBENCH_TOUR_DIR", project / "runs" / "tour"))  # in the project

# %%
import json

from IPython.display import Markdown, display

import workbench
from workbench import Event, Partition, Schedule, Timeline, Topology, parse_action

print(f"workbench {workbench.__version__}")

# %% [markdown]
# ## Why split at all: what training holds in memory
#
# Training keeps four things on a device: the **weights**; one **gradient**
# per weight; the **optimizer state** (Adam keeps two running averages per
# weight); and the **activations**, what the forward pass saves for the
# backward pass, which grow with the batch. The first three are arithmetic on
# the parameter count: in fp32 with Adam, 4 + 4 + 8 = 16 bytes per parameter.
# Activations depend on the model's code, so the workbench counts them: it
# builds the model on torch's **meta device** (shapes and dtypes, no storage)
# and adds up what autograd saves in one forward pass and its loss.
#
# First a small GPT, profiled for real, to check that the count on the meta
# device is what a real pass keeps:

# %%
from workbench.lessons.memory import memory_figure, memory_story, memory_table, training_memory
from workbench.profiling import profile

tiny_profile = profile("gpt2-tiny", 8, progress=False)  # real tensors, every layer timed and counted
tiny = training_memory("gpt2-tiny", 8)  # the same model and batch on the meta device
profiled_saved = sum(layer.saved_bytes for layer in tiny_profile.layers)
print(f"gpt2-tiny, batch 8: the profiler saw {profiled_saved:,} bytes saved for backward; "
      f"the meta device counts {tiny.activations:,}")
assert profiled_saved == tiny.activations

# %% [markdown]
# The meta device needs no memory, so the same count works for a model no
# laptop could build: GPT-2 small, and a 7B-class GPT (the same code with
# hidden size 4096, 32 layers and 2,048-token sequences).

# %%
seven_b = {"n_embd": 4096, "n_layer": 32, "n_head": 32, "n_positions": 2048, "seq_len": 2048}
small = training_memory("gpt2-small", 8)
large = training_memory("gpt2-small", 1, label="GPT, 7B class", **seven_b)
rows = [tiny, small, large]
display(Markdown(memory_table(rows)))
memory_figure(rows, device_gib=80).show()
display(Markdown(memory_story(small, large, device_gib=80)))

# %% [markdown]
# There are three basic ways to split the work over devices, each drawn below
# for two devices and a model of four layers. **Data parallelism** gives every
# device the whole model and a part of the batch, and averages the gradients.
# **Pipeline parallelism** gives each device some of the layers and streams
# the batch through them. **Tensor parallelism** splits every layer's weight
# matrices, so the devices work on each layer together. The lessons take them
# one at a time, then mix them.

# %%
from workbench.lessons.pictures import strategy_pictures

strategy_pictures().show()

# %% [markdown]
# ## 1. An action is one instruction with a short name
#
# A pipeline schedule is made of tiny instructions: *stage* (a number), *what*
# (an op) and usually *which micro-batch*. Written down they read like moves in a
# chess game. `1F3` is "stage 1 runs the forward pass of micro-batch 3", `0B2` is
# "stage 0 runs the backward pass of micro-batch 2", `0SEND_F3>1` is "stage 0
# sends micro-batch 3's activation to rank 1".

# %%
action = parse_action("1F3")
print(repr(action))
print("as text:", action, "| compute?", action.is_compute)

# %% [markdown]
# The text form is not a pretty-printer bolted on: it *is* the value. Parse it,
# print it, and you get exactly what you started with, for every kind of action
# (sends and receives name their peer rank; `AR` is a gradient all-reduce, `b2`
# restricts it to bucket 2; `STASH` keeps a weight version for an asynchronous
# pipeline).

# %%
texts = ["1F3", "0B2", "2W0", "0SEND_F3>1", "1RECV_F3<0", "0ARb2", "0STEP", "0STASH4"]
round_trips = {text: str(parse_action(text)) for text in texts}
for text, back in round_trips.items():
    print(f"{text:>11}  ->  {parse_action(text).to_dict()}  ->  {back}")

# %% [markdown]
# ## 2. A schedule is data: GPipe by hand
#
# GPipe runs every micro-batch forward through the pipeline, then every
# micro-batch backward. Here it is for 2 stages and 3 micro-batches, one line
# per rank, one token per time step; `.` is a step where the rank waits.
# In this hand-made version every action takes one step.

# %%
gpipe = Schedule.from_text(
    [
        "0F0 0F1 0F2 .   .   0B2 0B1 0B0",
        ".   1F0 1F1 1F2 1B2 1B1 1B0 .  ",
    ],
    name="gpipe-by-hand",
    num_stages=2,
    num_microbatches=3,
)
grid = gpipe.to_grid()
print(grid)

# %% [markdown]
# Read the grid top to bottom: rank 1 cannot start until rank 0 has finished
# micro-batch 0, and rank 0 cannot start its backward passes until rank 1 has
# sent the first gradient back. Those dots are the **pipeline bubble**. With
# $S$ stages and $M$ micro-batches GPipe idles each rank for a fraction
# $(S-1)/(M+S-1)$ of the time: here $1/4$. More micro-batches shrink the bubble;
# section 5 measures it.
#
# Because a schedule is just data, it survives a trip through text or JSON
# unchanged, which is how the simulator, the validator, the runtime and the
# figures all consume the *same* schedule.

# %%
from_text = Schedule.from_text(gpipe.to_text(), name=gpipe.name, num_stages=2, num_microbatches=3)
from_json = Schedule.from_json(gpipe.to_json())
print(gpipe.to_json(indent=1))
print("text round trip holds:", from_text == gpipe, "| JSON round trip holds:", from_json == gpipe)

# %% [markdown]
# ## 3. A partition says which layers each stage owns
#
# Stages own contiguous runs of layers. `"0-3|4-9"` gives layers 0 to 3 to
# stage 0 and layers 4 to 9 to stage 1. Given a cost per layer, `stage_sums`
# adds it up per stage; the slowest stage sets the pace of the whole pipeline,
# which is why partitioning matters.

# %%
partition = Partition.parse("0-3|4-9")
layer_ms = [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]  # a made-up cost per layer
stage_ms = partition.stage_sums(layer_ms)
print("partition:", partition, "| layers per stage:", partition.sizes)
for stage in range(partition.num_stages):
    print(f"  stage {stage}: layers {list(partition.layers(stage))} -> {stage_ms[stage]:.1f} ms")
print(f"slowest stage: {max(stage_ms):.1f} ms of {sum(layer_ms):.1f} ms in total")

# %% [markdown]
# ## 4. A topology lays ranks out on named axes
#
# Four ranks running 2 data-parallel replicas of a 2-stage pipeline form a
# `Topology(dp=2, pp=2)`. Ranks are numbered row-major (the last axis varies
# fastest), so the two stages of one pipeline sit on neighbouring ranks.
# `groups("pp")` lists who passes activations to whom; `groups("dp")` lists who
# all-reduces gradients together.

# %%
topology = Topology(dp=2, pp=2)
print(topology, "->", topology.world_size, "ranks")
print(topology.describe())
print("pipelines   (pp groups):", topology.groups("pp"))
print("replicas    (dp groups):", topology.groups("dp"))
print("rank 0 sends activations to rank", topology.peer(0, "pp", +1), "| after rank 1 comes", topology.peer(1, "pp", +1))

# %% [markdown]
# ## 5. Events and timelines: what ran where, and when
#
# The simulator turns a schedule plus measured layer costs into `Event`s, and
# real jobs record the same `Event`s with measured times, so one figure can
# overlay prediction and measurement. Here we make the events ourselves from
# the grid: one step lasts 1 ms. Then the timeline tells us each rank's bubble,
# and exports a Chrome trace you can open in [Perfetto](https://ui.perfetto.dev).

# %%
events = [
    Event(rank=rank, stage=step_action.stage, op=step_action.op, start=float(step), end=float(step + 1),
          microbatch=step_action.microbatch)
    for rank, slots in enumerate(gpipe)
    for step, step_action in enumerate(slots)
    if step_action is not None
]
timeline = Timeline(tuple(events), meta={"schedule": gpipe.name})
bubbles = {rank: timeline.bubble_fraction(rank) for rank in timeline.ranks}
expected_bubble = (gpipe.num_stages - 1) / (gpipe.num_microbatches + gpipe.num_stages - 1)
print(f"{len(timeline)} events over {timeline.makespan:.0f} ms")
for rank, bubble in bubbles.items():
    print(f"  rank {rank}: bubble {bubble:.0%} (GPipe formula: {expected_bubble:.0%})")

# %% [markdown]
# The same timeline as a Chrome trace: one slice per event.

# %%
trace_path = timeline.save_chrome_trace(trace_dir / "gpipe_by_hand.json")
trace = json.loads(trace_path.read_text())
slices = [entry for entry in trace["traceEvents"] if entry["ph"] == "X"]
print(f"Chrome trace: {trace_path} ({len(slices)} slices)")

# %% [markdown]
# ## Exercises
#
# 1. **1F1B by hand.** Write the 1F1B schedule for 2 stages and 3
#    micro-batches as text, one line per rank, as GPipe was written above
#    (stage 0 starts with $S - s - 1 = 1$ forward before it alternates). Then
#    check it against the generator the runtime uses, `one_f_one_b(2, 3)`.
# 2. **The best cut.** With `layer_ms` above, which single cut of the ten
#    layers into two stages makes the slowest stage fastest? Guess, then
#    check every cut with `Partition`.

# %% tags=["solution"]
# Exercise 1, one answer: stage 0 warms up with one forward, then alternates; stage 1 alternates from the start.
from workbench.scheduling import one_f_one_b

by_hand = Schedule.from_text(["0F0 0F1 0B0 0F2 0B1 0B2", "1F0 1B0 1F1 1B1 1F2 1B2"])
generated = one_f_one_b(2, 3)
same = all([(a.op, a.microbatch) for a in by_hand.actions(r)] == [(a.op, a.microbatch) for a in generated.actions(r)]
           for r in range(2))
print("the hand-written 1F1B matches the generator:", same)
assert same

# %% tags=["solution"]
# Exercise 2, one answer: try every cut and keep the one whose slowest stage is fastest.
cuts = {f"0-{k - 1}|{k}-9": max(Partition.parse(f"0-{k - 1}|{k}-9").stage_sums(layer_ms)) for k in range(1, 10)}
best = min(cuts.values())
print("slowest stage per cut:", {cut: ms for cut, ms in cuts.items()})
print(f"best: {best} ms, at " + " and ".join(cut for cut, ms in cuts.items() if ms == best))
assert best == max(stage_ms)  # the tour's cut 0-3|4-9 is one of the best

# %% [markdown]
# ## Where next
#
# The lessons that follow put these values to work, each with real runs:
#
# | notebook | what it teaches |
# |---|---|
# | [01_data_parallel_and_sharding](01_data_parallel_and_sharding.ipynb) | data parallelism and sharding: the ring all-reduce, DDP's buckets, ZeRO and FSDP memory per rank, recomputation |
# | [02_pipeline_schedules_explained](02_pipeline_schedules_explained.ipynb) | GPipe, 1F1B, interleaved, zero bubble, asynchronous: bubbles, memory, exercises with answers |
# | [03_profile_and_partition](03_profile_and_partition.ipynb) | profile a model layer by layer, cut it with AMPA, drag the boundaries yourself |
# | [04_gropipe](04_gropipe.ipynb) | grouped pipelines with a delayed all-reduce, measured against the simulator and against DDP |
# | [05_async_pipeline](05_async_pipeline.ipynb) | weight stashing and staleness in the asynchronous pipeline |
# | [06_tensor_parallel_2d](06_tensor_parallel_2d.ipynb) | Megatron 1D by hand, SUMMA on a q x q grid, bytes per rank, and a real 2 x 2 run equal to dense |
# | [07_planner](07_planner.ipynb) | which mix of strategies is fastest for this machine and for an 8-GPU server |
# | [08_scale_out](08_scale_out.ipynb) | several nodes with torchrun, and Slurm; which stage goes on which node |
#
# A word you do not know is in the [glossary](../docs/glossary.md), with the
# lesson that teaches it and a guide to which strategy to start with.
#
# The last two cells below check that everything this tour showed actually holds.

# %%
assert large.state > 80 * 2**30 > small.total  # the 7B-class model's state alone overflows one 80 GiB device
assert tiny.params == sum(layer.num_params for layer in tiny_profile.layers)
grid_rows = grid.splitlines()[2:]  # below the header and its rule
assert len(grid_rows) == 8, f"GPipe with S=2, M=3 takes 2*(M+S-1) = 8 steps, the grid shows {len(grid_rows)}"
assert all(text == back for text, back in round_trips.items()), round_trips

# %%
assert from_text == gpipe and from_json == gpipe
computed = {(a.stage, a.op.value, a.microbatch) for rank in range(gpipe.num_ranks) for a in gpipe.actions(rank)}
assert computed == {(s, op, m) for s in range(2) for op in "FB" for m in range(3)}
assert partition.sizes == [4, 6] and stage_ms == [4.0, 3.0]
assert topology.groups("pp") == [[0, 1], [2, 3]] and topology.groups("dp") == [[0, 2], [1, 3]]
assert all(abs(bubble - expected_bubble) < 1e-9 for bubble in bubbles.values()), bubbles
assert len(slices) == len(events) == 12
print(f"tour OK: {len(grid_rows)} steps, bubble {expected_bubble:.0%}, {len(slices)} trace slices")
