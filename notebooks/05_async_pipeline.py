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
# # The asynchronous pipeline: weight stashing and stale gradients
#
# A synchronous pipeline (GPipe, 1F1B) drains before every optimizer step: the
# last micro-batch's backward must reach stage 0 before anyone updates, and the
# fill and drain of every iteration are idle time. The asynchronous pipeline
# (PipeDream) lets the next iteration's micro-batches in while the current one
# is still going back, so the pipeline never drains.
#
# The price is that a stage now updates its weights while micro-batches that
# ran their forward on the *old* weights are still in flight. This notebook
#
# 1. draws the asynchronous schedule and the weight **version** every forward uses,
# 2. shows what stashing those versions costs in memory, and how many micro-batches
#    to keep in flight when memory is short,
# 3. places the stages on a two-node cluster so the heaviest transfers stay inside a node,
# 4. trains for real (4 `torchrun` ranks) with and without stashing, next to the
#    synchronous pipeline, shows the unstashed run diverge, checks from the
#    recorded versions what each backward used, and measures how long each run
#    trains before its validation accuracy reaches a target.
#
# Every term is defined in the [glossary](../docs/glossary.md), with the lesson that teaches it.

# %% tags=["parameters"]
# Parameters. WORKBENCH_SMOKE=1 (the test suite) asks for a short run.
from workbench.lessons.runs import is_smoke_run, lesson_run_root

smoke = is_smoke_run()
steps = 30 if smoke else 150  # training steps of each real run
stages = 4
microbatches = 4
train_microbatches = 1  # per step in the real runs: stage 0's backward comes three steps after its forward
learning_rate = 0.4
eval_every = 5 if smoke else 10  # steps between evaluations on the held-out digits
target_accuracy = 0.85  # the validation accuracy whose time to reach is compared
run_root = lesson_run_root()  # WORKBENCH_RUN_ROOT, or the project's runs/

# %%
from workbench.scheduling.generators import async_1f1b, one_f_one_b
from workbench.scheduling.memory import memory_breakdown
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts
from workbench.viz.timeline import timeline_figure

# %% [markdown]
# ## 1. One stream of micro-batches, several weight versions
#
# `async_1f1b` runs 1F1B over the micro-batches of *all* iterations as one
# stream, and stage `s` applies its step right after its own last backward of
# an iteration. Each forward is tagged with the weight version it uses (the
# number of steps its stage had applied), and its backward must use the same
# one. Below, stage 0 starts iteration 1 on version 0 while iteration 0 is
# still going back: those micro-batches need version 0 kept after the update.

# %%
stream = async_1f1b(stages, microbatches, 3)
for a in stream.actions(0)[:14]:
    print(f"stage 0: {a.op.value:<4} iteration {a.iteration} micro-batch {a.microbatch} version {a.version}")

# %% [markdown]
# Uniform stages (forward 1, backward 2 time units): the synchronous pipeline
# pays the fill and drain every iteration, the asynchronous one only once.

# %%
costs = StageCosts.uniform(stages, param_bytes=4_000_000, activation_bytes=1_000_000)
sync_sim = simulate(one_f_one_b(stages, microbatches), costs)
async_sim = simulate(async_1f1b(stages, microbatches, 8), costs)
print(f"1F1B  iteration {sync_sim.metrics['iteration_ms']:.2f} units")
print(f"async iteration {async_sim.metrics['iteration_ms']:.2f} units (8 iterations, fill paid once)")
timeline_figure(simulate(async_1f1b(stages, microbatches, 2), costs).timeline,
                title="asynchronous 1F1B, 2 iterations: no flush between them")

# %% [markdown]
# ## 2. What the versions cost, and how many micro-batches to keep in flight
#
# The memory model walks each rank's actions: activations of in-flight
# micro-batches, plus one stashed copy of the weights for every older version
# they use. PipeDream-2BW (`mode="2bw"`) keeps exactly two versions on every
# stage (iteration `t` runs on version `t - 1`); vertical sync makes every
# stage use the version stage 0 used.

# %%
for label, options in (("stash", {}), ("vertical sync", {"vertical_sync": True}), ("2bw", {"mode": "2bw"})):
    rows = memory_breakdown(async_1f1b(stages, microbatches, 4, **options), costs)
    print(f"{label:<14}", "stashed MB per stage:", [r["stashed_weights"] / 1e6 for r in rows])

# %% [markdown]
# Fewer micro-batches in flight need less memory but fill the pipeline less.
# `choose_inflight` builds every candidate with the real generator, reads its
# peak from the memory model and its time from the simulator, and keeps the
# cheapest one within 2% of the fastest that fits the cap.

# %%
from workbench.scheduling.adaptive import choose_inflight

unlimited = choose_inflight(costs, microbatches)
capped = choose_inflight(costs, microbatches, memory_cap_bytes=int(max(unlimited.peak_bytes) * 0.8))
print(capped.table())
print("no cap:", unlimited.inflight, " 80% of that memory:", capped.inflight)

# %% [markdown]
# ## 3. Real training: synchronous, asynchronous, and asynchronous without stashing
#
# Three real runs of the MLP on the digits task, 4 ranks each (one per stage),
# the same batches, plain SGD at a large learning rate: the 1F1B pipeline, the
# asynchronous pipeline with weight stashing, and the asynchronous pipeline
# with stashing switched off, whose backwards read whatever weights the stage
# holds by then. With one micro-batch per step, stage 0 keeps four in flight,
# so each of its backwards comes three steps after its forward (stage 1: two,
# stage 2: one).
#
# Each run's parallel plan is given by its name. `pp4-1f1b-m1` is one 4-stage
# 1F1B pipeline with 1 micro-batch per step; `async-1x4-m1-if4` is 1 replica
# of a 4-stage asynchronous pipeline (`[plan.pipeline] kind = "async"`) with
# `inflight = 4` micro-batches in flight on every stage; `-nostash` sets
# `stash = false`. As a `[plan]` table the last one reads
# `mesh = {dp = 1, pp = 4}`, `microbatches = 1` and
# `[plan.pipeline] kind = "async"`, `inflight = 4`, `stash = false`.
#
# Every `eval_every` steps, and after the last, rank 0 gathers the stages'
# weights into one copy of the model and measures its loss and accuracy on
# held-out digits (never trained on). With `target_accuracy` in the config,
# the job's status reports the first evaluation at or above it
# (`time_to_target`): its step, and the seconds of training until then (the
# sum of the step times, evaluations excluded).

# %%
from workbench import ParallelPlan
from workbench.jobs import LaunchSpec, launch_sweep

base = {"model": "mlp", "data": {"kind": "digits"},
        "training": {"global_batch": 32, "steps": steps, "optimizer": {"name": "sgd", "lr": learning_rate}},
        "evaluation": {"every": eval_every, "target_accuracy": target_accuracy}}
m = train_microbatches
runs = {"1f1b (sync)": f"pp{stages}-1f1b-m{m}", "async": f"async-1x{stages}-m{m}-if{stages}",
        "async, no stash": f"async-1x{stages}-m{m}-nostash-if{stages}"}
print(ParallelPlan.parse(runs["async, no stash"]).to_dict())
# the three runs train one after another in the same four processes (one start for all of them)
jobs = dict(zip(runs, launch_sweep([
    LaunchSpec(config={**base, "plan": plan_name, "name": label.split()[0].replace(",", "")}, run_root=run_root)
    for label, plan_name in runs.items()])))

# %%
from workbench.lessons.runs import loss_figure, rank_losses

for label, plan_name in runs.items():
    print(f"{label} ({plan_name}) ->", jobs[label].wait(timeout=300).state)
losses = {label: rank_losses(job.metrics()) for label, job in jobs.items()}  # rank 0's, step by step
loss_figure(losses, title="loss per step (same samples); a diverged curve leaves the plot", x_title="step",
            mode="lines", yaxis_range=[0, 3.5])

# %% [markdown]
# The synchronous run and the stashed one both learn; the stashed one pays a
# little for its stale gradients (stage 0 updates with a gradient taken on
# weights three steps old) and recovers from its loss spikes. The unstashed run
# diverges: its loss explodes and turns NaN within the first half of the run.
#
# Why the gap: a linear layer's backward sends `g @ W` upstream, where `W` should
# be the weights its forward used. Without stashing it is the newer
# `W - lr * sum(g' x'^T)` (the steps taken in between), so the gradient sent
# upstream carries an extra `-lr * sum((g . g') x')`. While successive
# gradients agree (`g . g' > 0`) that term points against the layer's own
# inputs `x'`, and descending it makes them *grow*: a feedback whose strength
# is the learning rate times the number of steps between a forward and its
# backward. Stashing removes it, because the backward then
# reads exactly the forward's weights; staleness alone only delays the gradient.
# At a small learning rate with one step in between (lr 0.05, 4 micro-batches
# per step) the feedback is too weak to see, and the unstashed run ends where
# the stashed one does; `tests/runtime/test_async_convergence.py` checks both
# regimes.

# %% [markdown]
# Every forward and backward event recorded the version of the weights it
# actually used: the backward records the version its autograd graph reads
# when it runs. With stashing that is always its forward's version; without,
# the stage has overwritten the weights in the meantime.

# %%
from workbench.lessons.async_pipeline import weight_versions

mismatched = {}
for label in ("async", "async, no stash"):
    used = weight_versions(jobs[label].run_dir)  # (stage, iteration, micro-batch) -> {"F": version, "B": version}
    mismatched[label] = sum(v["F"] != v["B"] for v in used.values())
    print(f"{label:<16} {len(used)} micro-batch x stage pairs, backward on another version than forward: "
          f"{mismatched[label]}")
final = {label: sum(values[-10:]) / 10 for label, values in losses.items()}
for label, value in final.items():
    print(f"{label:<16} first loss {losses[label][0]:.3f}, final loss (mean of last 10 steps) {value:.3f}")

# %% [markdown]
# ### Time to accuracy
#
# Loss per step is not what a strategy is chosen on: what counts is how soon
# the model is good enough. Below, each run's validation accuracy against its
# training seconds, with the target as a dashed line. On this machine four
# processes share two cores, so the seconds are only roughly comparable
# between runs; the step at which a run reaches the target does not depend on
# the machine's load (the runs see the same batches and are evaluated on the
# same samples).

# %%
from IPython.display import Markdown, display

from workbench.lessons.async_pipeline import stash_cost_text
from workbench.lessons.targets import accuracy_figure, reach_text

evals = {label: job.evals() for label, job in jobs.items()}
reach = {label: job.status().time_to_target for label, job in jobs.items()}
display(accuracy_figure(evals, target_accuracy, eval_every))
sync, stashed = reach["1f1b (sync)"], reach["async"]
display(Markdown(reach_text(reach, target_accuracy, steps) + stash_cost_text(sync, stashed)))

# %% [markdown]
# ## 4. Where pipelining pays on this machine
#
# Counting idle units says how full a pipeline is; whether it is *faster*
# than not pipelining depends on the model and the machine. Here are two
# ranks, one per core of this machine, training ResNet-18 on 96x96 images
# (a global batch of 64, synthetic data), run three ways:
#
# * **naive** model parallelism: the batch as one micro-batch, so one stage
#   is busy at a time;
# * **1F1B** with `pays_microbatches` micro-batches: the stages work at
#   once, but the pipeline flushes every step, so at best it is
#   $S M / (M + S - 1)$ times naive;
# * the **asynchronous** pipeline with as many micro-batches: no flush, so at
#   best it is $S$ times naive.
#
# Whether a pipeline pays on a CPU depends on what a micro-batch of 16
# samples costs against a quarter of the batch of 64, stage by stage.
# `bench/bench_pipeline_gap.py` measures that and breaks the gap to the ideal
# down (`bench/RESULTS.md`): there, ResNet-18's deep layers, whose weights
# outweigh their activations, lose in small micro-batches at every image size
# it tried, and only from 96x96 on do its first layers gain enough to make up
# for it; with tiny models the fixed cost of each operator call dominates. The
# figures below are this machine's, measured now.

# %%
pays_microbatches = 4
pays_steps = 8 if smoke else 16
pays_skip = 3  # warm-up steps left out of the throughput
pays_base = {"model": {"name": "resnet18", "overrides": {"image_size": 96, "num_classes": 10}},
             "data": {"kind": "synthetic"},
             "training": {"global_batch": 64, "steps": pays_steps, "optimizer": {"name": "sgd", "lr": 0.01}}}
pays_runs = {"naive": "pp2-1f1b-m1", "1F1B": f"pp2-1f1b-m{pays_microbatches}",
             "async": f"async-1x2-m{pays_microbatches}"}
pays_jobs = dict(zip(pays_runs, launch_sweep([
    LaunchSpec(config={**pays_base, "plan": plan_name, "name": f"pays-{label.lower()}"}, run_root=run_root)
    for label, plan_name in pays_runs.items()])))
for label, plan_name in pays_runs.items():
    print(f"{label} ({plan_name}) ->", pays_jobs[label].wait(timeout=600).state)

# %% [markdown]
# Each run's throughput is rank 0's median samples per second after the
# warm-up steps, set against naive model parallelism's and against the ideal
# of each way of running.

# %%
from workbench.lessons.async_pipeline import speedup_figure, speedup_text
from workbench.lessons.runs import median_samples_per_s

pays = {label: median_samples_per_s(job.metrics(), after_step=pays_skip) for label, job in pays_jobs.items()}
speedup = {label: pays[label] / pays["naive"] for label in pays}
S_pays, M_pays = 2, pays_microbatches
ideal = {"naive": 1.0, "1F1B": S_pays * M_pays / (M_pays + S_pays - 1), "async": float(S_pays)}
display(speedup_figure(speedup, ideal, "ResNet-18 at 96x96 on two ranks: throughput over naive model parallelism"))
display(Markdown(speedup_text(pays["naive"], speedup, ideal)))

# %% [markdown]
# ## Exercises
#
# 1. **Fill paid once.** The asynchronous stream pays the pipeline's fill
#    and drain once for all its iterations, 1F1B once per iteration. Predict
#    the asynchronous iteration time for 1, 2, 8 and 32 iterations on the
#    uniform costs of section 1, then check with the simulator: which value
#    does it approach?
# 2. **The split backward under weight versions.** `async-1x4-m4-split`
#    runs each backward as its input gradient (sent upstream at once) and
#    then its weight gradient, both on the micro-batch's stashed version.
#    Predict whether it keeps more micro-batches in flight than the fused
#    stream, and whether it ends sooner on uniform costs. Check both.

# %% tags=["solution"]
# Exercise 1, one answer: the per-iteration time falls towards one stage's work per iteration, m * (F + B).
per_iteration_ms = {n: simulate(async_1f1b(stages, microbatches, n), costs).metrics["iteration_ms"]
                    for n in (1, 2, 8, 32)}
steady_ms = microbatches * (costs.forward_ms[0] + costs.backward_ms[0])
print({n: round(ms, 2) for n, ms in per_iteration_ms.items()}, f"-> steady state {steady_ms:.2f} (m (F + B))")
assert list(per_iteration_ms.values()) == sorted(per_iteration_ms.values(), reverse=True)
assert per_iteration_ms[32] - steady_ms < per_iteration_ms[1] - steady_ms

# %% tags=["solution"]
# Exercise 2, one answer: the same in-flight memory (W right after I), and an earlier end (I reaches upstream sooner).
from workbench.scheduling.memory import in_flight_microbatches
from workbench.scheduling.registry import schedule_for

fused, split = (schedule_for(ParallelPlan.parse(name), num_iterations=4)
                for name in ("async-1x4-m4", "async-1x4-m4-split"))
split_costs = StageCosts.uniform(stages, forward_ms=1.0, input_grad_ms=1.0, weight_grad_ms=1.0)
ends = {name: simulate(s, split_costs).metrics["makespan_ms"] for name, s in (("fused", fused), ("split", split))}
print("in flight per stage:", in_flight_microbatches(fused), in_flight_microbatches(split), "| run ends:", ends)
assert in_flight_microbatches(split) == in_flight_microbatches(fused) and ends["split"] <= ends["fused"]

# %% [markdown]
# ## Checks
#
# The asynchronous stream keeps the pipeline full (fewer idle units than 1F1B
# per iteration), stashing costs one weight copy on every stage but the last,
# the capped choice fits its cap, the synchronous and stashed runs learned, the recorded versions say
# stashing did its job while the unstashed run did not, and on ResNet-18 at
# 96x96 both 1F1B and the asynchronous pipeline trained faster than naive
# model parallelism. Then the evaluations: every run evaluated on schedule
# (accuracies in [0, 1], training seconds growing) and reports its time to
# the configured target (`check_evaluations` raises otherwise), and (in the
# full run) the unstashed run diverged: its final loss is above its first, or
# NaN, and it never reached the target, which the synchronous and the stashed
# runs both did.

# %%
assert async_sim.metrics["iteration_ms"] < sync_sim.metrics["iteration_ms"]
stash_rows = memory_breakdown(async_1f1b(stages, microbatches, 4), costs)
assert [r["stashed_weights"] for r in stash_rows] == [4_000_000] * (stages - 1) + [0]
assert max(capped.peak_bytes) <= max(unlimited.peak_bytes) * 0.8 and sum(capped.inflight) < sum(unlimited.inflight)
assert all(job.status().state == "SUCCEEDED" for job in jobs.values())
assert all(final[k] < 0.92 * losses[k][0] for k in ("1f1b (sync)", "async")), final
assert mismatched["async"] == 0 and mismatched["async, no stash"] > 0, mismatched
assert all(job.status().state == "SUCCEEDED" for job in pays_jobs.values())
# faster than naive, as the text above says; by how much depends on what else the machine's two cores run (a
# quiet machine: bench/bench_pipeline_gap.py in bench/RESULTS.md)
assert speedup["1F1B"] > 1.0 and speedup["async"] > 1.0, speedup

# %%
from workbench.lessons.targets import check_evaluations

check_evaluations(jobs, evals, reach, steps=steps, every=eval_every, target=target_accuracy)
if not smoke:  # the divergence takes tens of steps to build up
    assert not final["async, no stash"] <= losses["async, no stash"][0], final
    assert sync["reached"] and stashed["reached"] and not reach["async, no stash"]["reached"], reach
print("async pipeline notebook OK:", {k: round(v, 3) for k, v in final.items()})
