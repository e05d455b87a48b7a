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
# # Pipeline schedules, explained: GPipe, 1F1B, interleaved, asynchronous
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
# against the textbook formula, and ends with exercises. Nothing here needs
# torch: schedules are plain data.

# %% tags=["parameters"]
# Parameters: the pipeline we study. The lesson is small enough to run as is;
# WORKBENCH_SMOKE=1 (set by the test suite) changes nothing here.
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
# ## 1. GPipe: fill, then drain
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
# after a warm-up of $S - s$ forwards, stage $s$ alternates one forward, one
# backward. The bubble is the same, but a stage never holds more than $S - s$
# micro-batches in flight instead of $M$.

# %%
one_f_one_b_schedule = one_f_one_b(S, M)
validate(one_f_one_b_schedule)
one_f_one_b_result = simulate(one_f_one_b_schedule, costs)
in_flight = {"gpipe": in_flight_microbatches(gpipe_schedule), "1f1b": in_flight_microbatches(one_f_one_b_schedule)}
print(f"1F1B: simulated bubble {mean_bubble(one_f_one_b_result):.3f} (GPipe {mean_bubble(gpipe_result):.3f})")
for name, counts in in_flight.items():
    print(f"{name:>6}: micro-batches alive at once per rank {counts}")
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
# The catch is **staleness**: a forward may run on weights that are newer than
# the ones its backward will see, unless the stage keeps (stashes) the weight
# version the forward used. Each action below carries the weight `version` it
# uses; a backward always uses its forward's.

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
# ## 6. Play with it
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

# %%
# Exercise 1, checked by the simulator: the smallest M with a GPipe bubble under 10% on S stages.
target = 0.10
smallest_m = next(m for m in range(1, 200) if mean_bubble(simulate(gpipe(S, m), costs)) < target - 1e-12)
on_paper = 9 * (S - 1) + 1  # (S-1)/(M+S-1) < 1/10  <=>  M > 9 (S-1)
print(f"S={S}: the bubble drops below {target:.0%} at M = {smallest_m} (on paper: M = {on_paper})")

# %% [markdown]
# The last cell checks what this lesson claimed: on equal stages the simulated
# bubbles equal the formulas, 1F1B keeps fewer micro-batches alive than GPipe
# with the same bubble, interleaving and asynchrony shrink the bubble, and the
# asynchronous schedule's backward passes use their forward's weights.

# %%
assert abs(mean_bubble(gpipe_result) - gpipe_formula) < 1e-9
assert abs(mean_bubble(one_f_one_b_result) - gpipe_formula) < 1e-9
assert abs(mean_bubble(interleaved_result) - interleaved_formula) < 1e-9
assert abs(mean_bubble(async_result) - async_formula) < 1e-9
assert in_flight["gpipe"] == [M] * S and in_flight["1f1b"] == [min(S - s, M) for s in range(S)]
assert interleaved_result.metrics["iteration_ms"] < one_f_one_b_result.metrics["iteration_ms"]
assert async_result.metrics["iteration_ms"] < one_f_one_b_result.metrics["iteration_ms"]
forward_versions = {(a.stage, a.microbatch, a.iteration): a.version for a in async_schedule.actions(0) if a.op.value == "F"}
assert all(forward_versions[(a.stage, a.microbatch, a.iteration)] == a.version
           for a in async_schedule.actions(0) if a.op.value == "B")
assert smallest_m == on_paper
explorer_formula, _ = explorer.formula_value()
assert abs(explorer.simulated_bubble_fraction(explorer.result) - explorer_formula) < 1e-9
assert third_slot[S - 1] == "idle" and third_slot[0] == "0F2"  # still filling: the last rank waits
print(f"lesson OK: GPipe/1F1B {gpipe_formula:.3f}, interleaved {interleaved_formula:.3f}, "
      f"asynchronous {async_formula:.3f}; GPipe needs M = {smallest_m} for a bubble under 10%")
