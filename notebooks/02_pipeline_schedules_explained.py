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
# # Pipeline schedules, explained: GPipe, 1F1B, interleaved, asynchronous, zero bubble
#
# A pipeline cuts a model into $S$ stages on $S$ devices and streams $M$
# micro-batches through them. While the first micro-batch travels forward, the
# last stages have nothing to do; while the last gradients travel back, the
# first stages wait. Those idle stretches are the **bubble**. Every pipeline
# schedule invented since GPipe is a different answer to two questions:
#
# * how much of each device's time is bubble, and
# * how many micro-batches' activations must each device keep in memory?
#
# This lesson builds the four classic schedules from the same generators the
# runtime executes, times them with the simulator, checks the simulated bubble
# against the textbook formula, then splits the backward in two for the
# zero-bubble schedules (simulated from a real profile and run on two ranks),
# and ends with exercises. Up to section 6 nothing needs torch: schedules are
# plain data.
#
# Every term is defined in the [glossary](../docs/glossary.md), with the lesson that teaches it.

# %% tags=["parameters"]
# Parameters: the pipeline we study. The lesson is small enough to run as is;
# WORKBENCH_SMOKE=1 (set by the test suite) only shortens the real runs of section 6.
import os

from workbench.lessons.runs import lesson_run_root

smoke = os.environ.get("WORKBENCH_SMOKE") == "1"
run_root = lesson_run_root()  # WORKBENCH_RUN_ROOT, or the project's runs/
num_stages = 4          # S: devices in the pipeline
num_microbatches = 8    # M: micro-batches per iteration
num_chunks = 2          # v: model chunks per device for the interleaved schedule
async_iterations = 3    # iterations streamed back to back by the asynchronous schedule
forward_ms, backward_ms = 1.0, 2.0   # cost of one stage's forward / backward on one micro-batch

# %%
from workbench.scheduling import StageCosts, async_1f1b, gpipe, interleaved, one_f_one_b, simulate, validate
from workbench.scheduling.memory import in_flight_microbatches
from workbench.viz.timeline import timeline_figure

S, M, v = num_stages, num_microbatches, num_chunks
costs = StageCosts.uniform(S, forward_ms=forward_ms, backward_ms=backward_ms)


def mean_bubble(result) -> float:
    """The simulated bubble averaged over the ranks (they are equal for uniform stages)."""
    bubbles = result.metrics["bubble_fraction"]
    return sum(bubbles) / len(bubbles)


# %% [markdown]
# ## 0. Why micro-batches: naive model parallelism
#
# Cutting a model over $S$ devices without splitting the batch is *naive
# model parallelism*: the whole batch goes forward through device 0, then
# device 1, and so on, and back again. Only one device works at a time, so
# each idles for a share $(S-1)/S$ of the step, and $S$ devices train no
# faster than one (they only hold more). It is GPipe with a single
# micro-batch, $M = 1$; the cell times it with the same per-sample cost,
# one micro-batch $M$ times as large.

# %%
naive_costs = StageCosts.uniform(S, forward_ms=forward_ms * M, backward_ms=backward_ms * M)
naive_result = simulate(gpipe(S, 1), naive_costs)
naive_formula = (S - 1) / S
print(f"naive model parallelism on {S} devices: bubble {mean_bubble(naive_result):.3f} (formula (S-1)/S = "
      f"{naive_formula:.3f}), iteration {naive_result.metrics['iteration_ms']:.1f} ms for the batch that one "
      f"device computes in {(forward_ms + backward_ms) * M * S:.1f} ms")
timeline_figure(naive_result.timeline, title=f"Naive model parallelism: {S} stages, the batch as one piece")

# %% [markdown]
# ## 1. GPipe: fill, then drain
#
# Cut the batch into $M$ micro-batches and the devices can overlap: device 1
# works on micro-batch 0 while device 0 starts micro-batch 1.
#
# GPipe runs every micro-batch's forward pass, then every backward pass. The
# schedule is a list of actions per rank (`1F3`: stage 1, forward of
# micro-batch 3). Printed as a grid, each column is one rank's program in
# order; the simulator decides *when* each action can start.

# %%
gpipe_schedule = gpipe(S, M)
validate(gpipe_schedule)  # matched sends, no deadlock, every backward after its forward
print(gpipe_schedule.to_grid())

# %% [markdown]
# With equal stages, every rank idles for $S-1$ forward slots while the
# pipeline fills and $S-1$ backward slots while it drains, out of
# $M + S - 1$ slots in all. The bubble fraction is
#
# $$\text{bubble}_{\text{GPipe}} = \frac{S-1}{M+S-1}.$$
#
# The simulator does not know this formula: it replays the schedule with the
# costs we gave and measures each rank's idle time.

# %%
gpipe_result = simulate(gpipe_schedule, costs)
gpipe_formula = (S - 1) / (M + S - 1)
print(f"GPipe S={S} M={M}: simulated bubble {mean_bubble(gpipe_result):.3f}, formula {gpipe_formula:.3f}, "
      f"iteration {gpipe_result.metrics['iteration_ms']:.1f} ms")
timeline_figure(gpipe_result.timeline, title=f"GPipe, {S} stages x {M} micro-batches")

# %% [markdown]
# The grey gaps are the bubble. Notice also *when* each stage runs its first
# backward: only after all $M$ forwards. Every one of those $M$ micro-batches'
# activations waits in memory until then.
#
# ## 2. 1F1B: same bubble, less memory
#
# 1F1B (PipeDream-flush, DAPPLE) starts backward passes as soon as possible:
# stage $s$ (counted from 0) runs $S - s - 1$ warm-up forwards, then
# alternates one forward, one backward, so its first backward comes after
# $S - s$ forwards (stage $S-1$ alternates from the start). The bubble is the
# same, but a stage never holds more than $S - s$ micro-batches in flight
# instead of $M$. That is the memory point: GPipe's first stage keeps the
# activations of all $M$ micro-batches, which together are the whole batch
# whatever $M$ is, while 1F1B's keeps at most $S$ of them, a share $S/M$ of
# the batch that shrinks as the batch is cut into more micro-batches.

# %%
one_f_one_b_schedule = one_f_one_b(S, M)
validate(one_f_one_b_schedule)
one_f_one_b_result = simulate(one_f_one_b_schedule, costs)
in_flight = {"gpipe": in_flight_microbatches(gpipe_schedule), "1f1b": in_flight_microbatches(one_f_one_b_schedule)}
print(f"1F1B: simulated bubble {mean_bubble(one_f_one_b_result):.3f} (GPipe {mean_bubble(gpipe_result):.3f})")
for name, counts in in_flight.items():
    print(f"{name:>6}: micro-batches alive at once per rank {counts}: at most {max(counts) / M:.0%} of the batch's "
          "activations")
timeline_figure(one_f_one_b_result.timeline, title="1F1B: backward passes start during the pipeline")

# %% [markdown]
# ## 3. Interleaved 1F1B: smaller bubbles from smaller stages
#
# Megatron's interleaved schedule gives each device $v$ non-adjacent model
# chunks (device 0 holds chunks 0 and $S$, device 1 holds 1 and $S+1$, ...).
# A micro-batch now crosses the devices $v$ times, but each hop costs only
# $1/v$ of a stage, so the fill and drain shrink by $v$:
#
# $$\text{bubble}_{\text{interleaved}} = \frac{S-1}{vM+S-1}.$$
#
# The price is $v$ times as many point-to-point messages, and more
# activations alive at once (counted below in chunk-sized pieces, each $1/v$ of
# a stage's activations).

# %%
interleaved_schedule = interleaved(S, M, v)
validate(interleaved_schedule)
chunk_costs = StageCosts.uniform(S * v, forward_ms=forward_ms / v, backward_ms=backward_ms / v)
interleaved_result = simulate(interleaved_schedule, chunk_costs)
interleaved_formula = (S - 1) / (v * M + S - 1)
print(f"interleaved v={v}: simulated bubble {mean_bubble(interleaved_result):.3f}, formula {interleaved_formula:.3f}, "
      f"iteration {interleaved_result.metrics['iteration_ms']:.1f} ms (1F1B {one_f_one_b_result.metrics['iteration_ms']:.1f} ms)")
print("micro-batch chunks alive at once per rank:", in_flight_microbatches(interleaved_schedule))
timeline_figure(interleaved_result.timeline, title=f"Interleaved 1F1B, {v} chunks per device")

# %% [markdown]
# ## 4. Asynchronous pipelines: no flush at all
#
# Every schedule so far ends each iteration with a flush: all gradients are
# in before the optimizer steps, so training is exactly what one device would
# compute. PipeDream drops the flush: iteration $t+1$'s forwards start while
# iteration $t$'s backwards are still running, and each stage steps as soon as
# its own backwards are done. The fill and drain are paid once for the whole
# run instead of once per iteration.
#
# The catch is in the weights. Between a micro-batch's forward and its
# backward the stage may already have stepped on other micro-batches, so
# without care the backward runs on weights *newer* than its forward used:
# the gradient mixes two weight versions and is simply wrong (inconsistent).
# PipeDream keeps (stashes) the version each forward used and gives it to the
# matching backward: the gradient is then consistent, but computed on weights
# a few updates old when it is applied (**stale**). Each action below carries
# the weight `version` it uses; a backward always uses its forward's.
# Notebook 05 measures both effects.

# %%
async_schedule = async_1f1b(S, M, async_iterations)
validate(async_schedule)
async_result = simulate(async_schedule, costs)
async_formula = (S - 1) / (async_iterations * M + S - 1)
print(f"asynchronous, {async_iterations} iterations: simulated bubble {mean_bubble(async_result):.3f}, "
      f"formula (S-1)/(kM+S-1) = {async_formula:.3f}; iteration {async_result.metrics['iteration_ms']:.1f} ms")
versions_on_stage_0 = sorted({a.version for a in async_schedule.actions(0) if a.version is not None})
print("weight versions used by stage 0:", versions_on_stage_0)
timeline_figure(async_result.timeline, title=f"Asynchronous 1F1B, {async_iterations} iterations without a flush")

# %% [markdown]
# Which way does the mismatch go? Walk stage 0's actions: the live weights
# move to the next version at each `STEP`; each backward is compared with the
# version its forward used.

# %%
from IPython.display import Markdown, display
from workbench.core.ir import Op
live, forward_version, lag = 0, {}, []
for action in async_schedule.actions(0):
    if action.op is Op.STEP:
        live += 1
    elif action.op is Op.FORWARD:
        forward_version[(action.iteration, action.microbatch)] = action.version
    elif action.op is Op.BACKWARD:
        assert action.version == forward_version[(action.iteration, action.microbatch)]  # stashed: its forward's
        lag.append(live - action.version)
assert min(lag) >= 0 and max(lag) > 0  # never older weights, sometimes newer ones
display(Markdown(f"Without stashing, {sum(d > 0 for d in lag)} of the {len(lag)} backwards on stage 0 would read "
                 f"weights newer than their forward's (by up to {max(lag)} version{'s' if max(lag) > 1 else ''}) "
                 f"and none older ones: the backward runs *ahead* of its forward's weights."))

# %% [markdown]
# ## 5. The four side by side
#
# Per-iteration time, bubble and memory for the same model and the same
# micro-batches. Which one is "best" depends on what you are short of: time
# (interleaved, asynchronous), memory (1F1B), or exactness of the training
# (everything but asynchronous).

# %%
rows = [
    ("GPipe", gpipe_result, gpipe_formula, gpipe_schedule),
    ("1F1B", one_f_one_b_result, gpipe_formula, one_f_one_b_schedule),
    (f"interleaved (v={v})", interleaved_result, interleaved_formula, interleaved_schedule),
    (f"asynchronous ({async_iterations} it.)", async_result, async_formula, async_schedule),
]
print(f"{'schedule':<22}{'iteration ms':>14}{'bubble':>9}{'formula':>9}{'max in flight':>15}")
for name, result, formula, schedule in rows:
    print(f"{name:<22}{result.metrics['iteration_ms']:>14.1f}{mean_bubble(result):>9.3f}{formula:>9.3f}"
          f"{max(in_flight_microbatches(schedule)):>15}")

# %% [markdown]
# ## 6. Zero bubble: split the backward in two
#
# A stage's backward does two jobs. The **input gradient** (I) is what the
# previous stage waits for; the **weight gradient** (W) is needed only by the
# optimizer step at the end of the iteration. Run as two passes, W becomes
# filler: a stage can postpone it into the slots where it would otherwise
# wait. The schedules built on that split:
#
# * **ZB-H1** keeps 1F1B's memory (at most $S$ micro-batches alive) and pushes
#   W into the drain: the bubble falls from $(S-1)(F+I+W)$ to $(S-1)(F+I-W)$.
# * **ZB-H2** lets stage 0 warm up with up to $2S-1$ forwards so W can fill
#   the fill phase too: no idle time between a rank's first and last pass, for
#   about twice the activations.
# * **ZB-V** gives each rank two chunks in a V (rank 0 holds the first and the
#   last chunk), so the backward starts on the rank where the forward ended:
#   no steady-state bubble, at 1F1B's memory.
# * **zb-auto** builds the schedule from the stages' measured F, I and W under
#   a per-rank memory limit (`zbauto-mem<MB>` in a plan name); it keeps a
#   hand-made schedule when none of its own candidates beats it.
#
# Each kind is a plan name, and the schedule registry turns it into the
# actions the runtime executes. First the textbook case, $F = I = W$ = 1 ms
# (a V-shaped kind's chunk is half a stage, so every rank has the same work).
# "Bubble" is a rank's idle time in one flushed iteration; "steady" is the
# idle time between its first and last pass, what is left when iterations
# run back to back.

# %%
from workbench.lessons.schedules import zero_bubble_table, zero_bubble_uniform

zb_kinds = ("1f1b", "zbh1", "zbh2", "zbv")
# per kind: (result, bubble ms, steady bubble ms of the worst rank, peak micro-batches) on F = I = W = 1 ms
zb_results = {kind: zero_bubble_uniform(S, M, kind) for kind in zb_kinds}
zb_formulas = {"1f1b": ("(S-1)(F+I+W)", (S - 1) * 3.0, S), "zbh1": ("(S-1)(F+I-W)", (S - 1) * 1.0, S),
               "zbh2": ("0 steady", 0.0, 2 * S - 1), "zbv": ("0 steady", 0.0, S)}
print(f"S={S}, M={M}, F = I = W = 1 ms")
print(zero_bubble_table(zb_results, zb_formulas))
for kind, (text, value, peak_formula) in zb_formulas.items():
    _, bubble, steady, peak = zb_results[kind]
    assert abs((steady if "steady" in text else bubble) - value) < 1e-9 and peak == peak_formula, kind
timeline_figure(zb_results["zbh1"][0].timeline, title=f"ZB-H1, {S} stages x {M} micro-batches: "
                "W (light green) fills the drain")

# %% [markdown]
# On the timeline, I (teal) travels back through the stages as the full
# backward did, and each W (light green) runs where its stage would have
# waited. Now a real model: a small GPT-2, profiled layer by layer at the
# micro-batch size of the runs below (I and W measured separately), cut into
# two stages (four chunks for ZB-V), simulated from that profile, then run
# for real on two ranks. On a CPU, splitting the backward is not free: the
# two passes re-walk parts of the graph that one fused backward walks once.
# The profile measures that price, and the simulation pays it.

# %%
import torch

from workbench.core.config import RunConfig
from workbench.profiling import profile
from workbench.runtime.batches import run_model

torch.set_num_threads(1)  # each rank runs one thread; profile like one
zb_m = 4
zb_base = {"model": {"name": "gpt2-tiny", "overrides": {"n_layer": 6, "n_embd": 128, "n_head": 4, "seq_len": 64,
                                                       "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}},
           "data": {"kind": "bytes-lm", "seq_len": 64},
           "training": {"global_batch": 32, "steps": 6 if smoke else 20, "seed": 0,
                        "optimizer": {"name": "sgd", "lr": 0.05}}}
zb_model = run_model(RunConfig.from_dict({**zb_base, "plan": f"pp2-1f1b-m{zb_m}"}))

# %% [markdown]
# The profile, at the micro-batch size of the runs, says what the backward
# costs fused and split into I + W; then each plan is cut into equal stages
# (four chunks for ZB-V), costed from the profile and simulated.

# %%
from workbench import ParallelPlan
from workbench.lessons.schedules import backward_cost, backward_cost_text, simulate_from_profile

zb_micro = zb_base["training"]["global_batch"] // zb_m
zb_profile = profile(zb_model, batch=zb_micro, progress=False)
zb_backward = backward_cost(zb_profile)
print(backward_cost_text(zb_profile, zb_micro))
zb_plans = {kind: ParallelPlan.parse(f"pp2-{kind}-m{zb_m}") for kind in (*zb_kinds, "zbauto")}
zb_simulated = simulate_from_profile(zb_profile, zb_plans, zb_micro, optimizer="sgd")
for kind, ms in zb_simulated.items():
    print(f"{kind:<7} simulated iteration {ms:7.2f} ms ({zb_simulated['1f1b'] / ms:.3f} x 1F1B's speed)")
assert zb_simulated["zbauto"] <= zb_simulated["zbh1"] + 1e-9  # the automatic schedule never loses to ZB-H1

# %% [markdown]
# The same five plans, launched for real: one after another in the same two
# `torchrun` ranks (`launch_sweep`: one process start for all five), the
# same samples, one step time per step (the slower rank's), median over the
# steps after the first two.

# %%
from workbench.jobs import LaunchSpec, launch_sweep
from workbench.lessons.schedules import measured_runs, measured_table

zb_jobs = dict(zip(zb_plans, launch_sweep([
    LaunchSpec(config={**zb_base, "plan": plan.name, "name": f"zb-{kind}"}, run_root=run_root)
    for kind, plan in zb_plans.items()])))
for kind in zb_plans:
    state = zb_jobs[kind].wait(timeout=300).state
    assert state == "SUCCEEDED", (kind, zb_jobs[kind].status().text())
zb_measured, zb_losses = measured_runs(zb_jobs, from_step=2)  # median step (slower rank); the last rank's losses
print(measured_table(zb_measured, zb_simulated))
# splitting the backward changes when gradients are computed, not what they are: the same losses
for kind, losses in zb_losses.items():
    assert len(losses) == len(zb_losses["1f1b"]) and all(
        abs(a - b) <= 1e-4 * abs(b) for a, b in zip(losses, zb_losses["1f1b"])), kind

# %%
from IPython.display import Markdown, display

from workbench.lessons.schedules import zero_bubble_summary

display(Markdown(zero_bubble_summary(zb_backward, zb_measured, zb_simulated)))

# %% [markdown]
# ## 7. Play with it
#
# The schedule explorer puts every knob of this lesson on a control: the
# schedule, stages, micro-batches, chunks, the backward/forward cost ratio
# and a transfer cost. It shows the formula beside the simulated bubble, lets
# you step through the run one time slot at a time (or press play), and draws
# a second schedule beside the first. With a transfer cost above zero, watch
# the formula stop being exact.

# %%
from workbench.widgets.schedule_explorer import ScheduleExplorer

explorer = ScheduleExplorer("1f1b", stages=S, microbatches=M, compare="gpipe")
explorer

# %% [markdown]
# Stepping in code does what the slot slider does: here is what every rank
# runs at the start of the third time slot, while the pipeline is still
# filling and the last rank waits for its first micro-batch.

# %%
explorer.step(2)
third_slot = explorer.slot_actions()
print({f"rank {rank}": action for rank, action in sorted(third_slot.items())})

# %% [markdown]
# ## Exercises
#
# 1. **How many micro-batches** does GPipe need on 4 stages to push the bubble
#    below 10%? Solve $\frac{S-1}{M+S-1} < 0.1$ on paper first, then check it
#    with the cell below.
# 2. **Unequal stages.** Make stage 2 twice as slow
#    (`StageCosts(forward_ms=..., ...)` or change `costs` above). Does the
#    formula still hold? Where does the bubble go?
# 3. **Interleaving has a limit.** Sweep `v` from 1 to 4 at $M = S$. The
#    formula keeps improving; what would a real network add that the formula
#    leaves out? (Hint: the simulator's `cluster` argument.)
# 4. **Staleness.** In the asynchronous schedule, how many weight versions must
#    stage 0 keep at once? Compare with the last stage.

# %% tags=["solution"]
# Exercise 1, checked by the simulator: the smallest M with a GPipe bubble under 10% on S stages.
target = 0.10
smallest_m = next(m for m in range(1, 200) if mean_bubble(simulate(gpipe(S, m), costs)) < target - 1e-12)
on_paper = 9 * (S - 1) + 1  # (S-1)/(M+S-1) < 1/10  <=>  M > 9 (S-1)
print(f"S={S}: the bubble drops below {target:.0%} at M = {smallest_m} (on paper: M = {on_paper})")

# %% [markdown]
# Exercise 2, one answer: stage 2 at twice the cost. The formula assumed equal
# stages; now the slow stage paces the pipeline and the others wait for it.

# %% tags=["solution"]
from dataclasses import replace

twice = lambda values: tuple(t * (2 if stage == 2 else 1) for stage, t in enumerate(values))  # noqa: E731
slow_result = simulate(gpipe(S, M), replace(costs, forward_ms=twice(costs.forward_ms),
                                            backward_ms=twice(costs.backward_ms)))
slow_bubbles = slow_result.metrics["bubble_fraction"]
print(f"iteration {slow_result.metrics['iteration_ms']:.1f} ms against {gpipe_result.metrics['iteration_ms']:.1f} "
      f"on equal stages; idle share per rank " + ", ".join(f"{b:.2f}" for b in slow_bubbles)
      + f" (the formula, for equal stages: {gpipe_formula:.2f})")
print(f"the slow stage idles least ({slow_bubbles[2]:.2f}); every other rank idles "
      f"{min(b for r, b in enumerate(slow_bubbles) if r != 2):.2f} or more: the bubble moved to the fast stages")

# %% [markdown]
# Exercise 3, one answer: $M = S$, chunks of 8 MiB activations sent over the
# PCIe links of the `8xV100-PCIe` preset, against the same chunks with free
# messages. Each extra chunk per device is one more message per micro-batch
# and hop.

# %% tags=["solution"]
from workbench.planning.costs.clusters import load_cluster

pcie = load_cluster("8xV100-PCIe")
chunk_counts = (1, 2, 3, 4)
ideal_ms, networked_ms = [], []
for chunks in chunk_counts:
    chunk = StageCosts.uniform(S * chunks, forward_ms=forward_ms / chunks, backward_ms=backward_ms / chunks)
    ideal_ms.append(simulate(interleaved(S, S, chunks), chunk).metrics["iteration_ms"])
    sending = replace(chunk, send_bytes=tuple([8 * 2**20] * (S * chunks)))
    networked_ms.append(simulate(interleaved(S, S, chunks), sending, pcie).metrics["iteration_ms"])
for chunks, ideal, networked in zip(chunk_counts, ideal_ms, networked_ms):
    print(f"v={chunks}: {ideal:.2f} ms with free messages, {networked:.2f} ms over PCIe")
best_v = chunk_counts[networked_ms.index(min(networked_ms))]
print(f"free messages: every extra chunk helps; over PCIe the fastest is v={best_v}, and v={chunk_counts[-1]} is "
      f"{networked_ms[-1] / min(networked_ms):.2f}x slower than that")

# %% [markdown]
# Exercise 4, one answer: the weight versions each stage of the asynchronous
# schedule keeps at once (`versions_by_stage`).

# %% tags=["solution"]
from workbench.scheduling.memory import versions_by_stage

versions_kept = versions_by_stage(async_schedule)
print("weight versions kept at once per stage:", versions_kept)
print(f"stage 0 keeps {versions_kept[0]}: its forwards run furthest ahead of their backwards; the last stage runs "
      f"each backward right after its forward and keeps {versions_kept[S - 1]}")

# %% [markdown]
# The last two cells check what this lesson claimed. The first: naive model
# parallelism idles each device $(S-1)/S$ of the step and is no faster than
# one device; on equal stages the simulated bubbles equal the formulas, 1F1B
# keeps fewer micro-batches alive than GPipe with the same bubble, and
# interleaving and asynchrony shrink the bubble. The second: the
# asynchronous schedule's backward passes use their forward's weights, and
# what the explorer and the answers to the exercises said.

# %%
assert abs(mean_bubble(naive_result) - naive_formula) < 1e-9
assert abs(naive_result.metrics["iteration_ms"] - (forward_ms + backward_ms) * M * S) < 1e-6  # no faster than one
assert abs(mean_bubble(gpipe_result) - gpipe_formula) < 1e-9
assert abs(mean_bubble(one_f_one_b_result) - gpipe_formula) < 1e-9
assert abs(mean_bubble(interleaved_result) - interleaved_formula) < 1e-9
assert abs(mean_bubble(async_result) - async_formula) < 1e-9
assert in_flight["gpipe"] == [M] * S and in_flight["1f1b"] == [min(S - s, M) for s in range(S)]
assert max(in_flight["1f1b"]) / M == min(S, M) / M  # S/M of the batch's activations, against all of it
for s in range(S):  # S - s - 1 warm-up forwards, then F B F B ...: S - s forwards before the first backward
    ops = [a.op.value for a in one_f_one_b_schedule.actions(s)]
    assert ops.index("B") == min(S - s, M), (s, ops)
assert interleaved_result.metrics["iteration_ms"] < one_f_one_b_result.metrics["iteration_ms"]
assert async_result.metrics["iteration_ms"] < one_f_one_b_result.metrics["iteration_ms"]

# %%
forward_versions = {(a.stage, a.microbatch, a.iteration): a.version for a in async_schedule.actions(0) if a.op.value == "F"}
assert all(forward_versions[(a.stage, a.microbatch, a.iteration)] == a.version
           for a in async_schedule.actions(0) if a.op.value == "B")
assert slow_bubbles[2] == min(slow_bubbles) and all(b > gpipe_formula for r, b in enumerate(slow_bubbles) if r != 2)
assert versions_kept[0] == max(versions_kept.values()) > versions_kept[S - 1] == 1
assert all(a > b for a, b in zip(ideal_ms, ideal_ms[1:])) and networked_ms[-1] > min(networked_ms)
assert smallest_m == on_paper
explorer_formula, _ = explorer.formula_value()
assert abs(explorer.simulated_bubble_fraction(explorer.result) - explorer_formula) < 1e-9
assert third_slot[S - 1] == "idle" and third_slot[0] == "0F2"  # still filling: the last rank waits
print(f"lesson OK: GPipe/1F1B {gpipe_formula:.3f}, interleaved {interleaved_formula:.3f}, "
      f"asynchronous {async_formula:.3f}; GPipe needs M = {smallest_m} for a bubble under 10%")
