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
# # Data parallelism and sharding: the all-reduce, DDP's buckets, ZeRO, FSDP, recomputation
#
# **Data parallelism** (DP) is where every strategy starts: each of $N$ ranks
# holds the whole model, trains on its own $1/N$ of the batch, and before each
# optimizer step the ranks average their gradients with an **all-reduce**
# (every rank ends with the sum of every rank's tensor). It needs no change to
# the model, and it costs two things: each rank keeps a full copy of the
# training state, and each step moves every gradient.
#
# This lesson measures both on this machine with the workbench's runtime
# (real `torchrun` ranks, gloo) and sets every measurement beside its formula:
#
# 1. the ring all-reduce's time against the bytes it moves;
# 2. memory per parameter, and how ZeRO and FSDP shard it, read from the
#    runtime's own memory records;
# 3. DDP's **buckets**, which hide part of the all-reduce inside the backward;
# 4. **recomputation**, which trades a second forward for activation memory.
#
# It ends with exercises, each with a solution the tests run.
#
# Every term is defined in the [glossary](../docs/glossary.md), with the lesson that teaches it.

# %% tags=["parameters"]
# Parameters: the model whose state we count (a small GPT-2) and the ranks. WORKBENCH_SMOKE=1 (the tests)
# runs fewer steps.
n_ranks = 2
model = {"name": "gpt2-tiny", "overrides": {"n_layer": 4, "n_embd": 256, "n_head": 4, "seq_len": 32}}
global_batch = 16
steps = 6

# %%
import json, os, subprocess, sys, tempfile  # noqa: E401

from workbench.core.config import RunConfig
from workbench.runtime.batches import run_model

smoke = os.environ.get("WORKBENCH_SMOKE") == "1"
run_root = os.environ.get("WORKBENCH_RUN_ROOT") or os.path.join(  # the project's runs/, from any folder
    next(d for d in (os.getcwd(), os.path.dirname(os.getcwd())) if os.path.isdir(os.path.join(d, "launch"))), "runs")
base = {"model": model, "data": {"kind": "bytes-lm", "seq_len": 32},
        "training": {"global_batch": global_batch, "steps": 4 if smoke else steps, "seed": 0,
                     "optimizer": {"name": "adam", "lr": 1e-3}}}
psi = sum(p.numel() for p in run_model(RunConfig.from_dict({**base, "plan": "dp1"})).parameters())
print(f"the model has {psi:,} parameters ({4 * psi / 2**20:.1f} MiB in fp32)")

# %% [markdown]
# ## 1. The ring all-reduce
#
# In a ring all-reduce the $N$ ranks pass chunks of $1/N$ of the tensor round
# a ring: $N-1$ steps add the chunks up, $N-1$ more hand the sums round. Each
# rank sends and receives $2(N-1)/N$ of the tensor, so for $B$ bytes on links
# of bandwidth $\beta$ and latency $\alpha$:
#
# $$t = 2(N-1)\,\alpha + \frac{2(N-1)}{N}\,\frac{B}{\beta}$$
#
# Past a few ranks the bytes each rank moves hardly depend on $N$: adding
# ranks does not make the gradient exchange cheaper or much dearer, which is
# why DP scales until the per-rank batch gets too small. The cell times
# all-reduces of growing size on 2 ranks (`workbench.runtime.commbench`,
# the benchmark the planner's links come from) and fits $\alpha$ and $\beta$.

# %%
sizes = [2**16, 2**18, 2**20, 2**22, 2**24, 2**26]  # 64 KiB .. 64 MiB
out = os.path.join(tempfile.mkdtemp(prefix="commbench-"), "link.json")
subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "-m", "workbench.runtime.commbench", "--out", out, "--sizes", ",".join(map(str, sizes)),
                "--iters", "8"], check=True, capture_output=True,
               env={**os.environ, "OMP_NUM_THREADS": "1"})
bench = json.load(open(out))
measured = {m["bytes"]: m["min_ms"] for m in bench["measurements"]["allreduce"]}
alpha_us, beta_gbs = bench["allreduce"]["latency_us"], bench["allreduce"]["bandwidth_gbs"]
for nbytes, ms in measured.items():
    print(f"{nbytes / 2**20:7.2f} MiB: {ms:8.3f} ms")
print(f"fit: alpha = {alpha_us:.0f} us, beta = {beta_gbs:.2f} GB/s")

# %%
import plotly.graph_objects as go

from workbench.core.costs import LinkSpec

link = LinkSpec("measured", latency_us=alpha_us, bandwidth_gbs=beta_gbs)
fig = go.Figure([go.Scatter(x=list(measured), y=list(measured.values()), mode="markers", name="measured"),
                 go.Scatter(x=sizes, y=[link.allreduce_ms(b, 2) for b in sizes], name="ring formula, fitted")])
fig.update_layout(title="All-reduce on 2 gloo ranks: time against bytes", xaxis_type="log", yaxis_type="log",
                  xaxis_title="bytes", yaxis_title="ms", template="plotly_white", height=340)
fig

# %% [markdown]
# Large messages are bandwidth-bound: four times the bytes should take about
# four times as long. On a CPU the per-byte cost still moves with the caches
# (a 16 MiB buffer may stay in them, a 64 MiB one does not) and with whatever
# else the cores run, so the check below holds the two largest sizes to
# linear within a factor of 2 either way (2x to 8x): far from the 1x a
# latency-bound message would show.

# %%
growth = measured[2**26] / measured[2**24]
assert 2 <= growth <= 8, growth
grads_ms = {n: link.allreduce_ms(4 * psi, n) for n in (2, 4, 8, 64)}
print(f"64 MiB took {growth:.2f}x the time of 16 MiB (bandwidth-bound: 4x)")
print("all-reduce of this model's gradients, by the fitted ring formula: "
      + ", ".join(f"{n} ranks {ms:.1f} ms" for n, ms in grads_ms.items()))

# %% [markdown]
# ## 2. Memory per parameter, and sharding it
#
# Training with Adam in fp32 keeps, per parameter: the weight (4 bytes), its
# gradient (4) and Adam's two moments (8), **16 bytes** in all, on every DP
# rank, before any activation. (Mixed precision keeps the same 16: a bf16
# weight and gradient, 2 + 2, and fp32 master weights and moments, 12.)
# **ZeRO** removes the copies: ZeRO-1 splits the optimizer state over the
# $N$ ranks, ZeRO-2 the gradients too, ZeRO-3, which torch calls **FSDP**
# (fully sharded data parallelism), the weights too, gathering each layer's
# weights just before it runs. For $\Psi$ parameters, per rank:
#
# | | weights | gradients | optimizer | communication per step |
# |---|---|---|---|---|
# | DDP | $4\Psi$ | $4\Psi$ | $8\Psi$ | all-reduce: 1x |
# | ZeRO-1 | $4\Psi$ | $4\Psi$ | $8\Psi/N$ | reduce-scatter + all-gather: 1x |
# | ZeRO-2 | $4\Psi$ | $4\Psi/N$ | $8\Psi/N$ | 1x |
# | FSDP (ZeRO-3) | $4\Psi/N$ | $4\Psi/N$ | $8\Psi/N$ | weights gathered twice: 1.5x |
#
# The runs below train the model with plain DDP, ZeRO-2 (`dp2-zero2`) and
# FSDP (`dp2-fsdp`) on 2 ranks, one after another in the same two processes,
# and read each rank's memory record from its last step.

# %%
from workbench.core.rundir import read_events
from workbench.jobs import LaunchSpec, launch, launch_sweep

plans = [f"dp{n_ranks}", f"dp{n_ranks}-zero2", f"dp{n_ranks}-fsdp", f"dp{n_ranks}-zero2-rc"]
jobs = dict(zip(plans, launch_sweep([LaunchSpec(config={**base, "plan": p, "name": f"sharding-{p}"},
                                                run_root=run_root) for p in plans])))
alone = launch(LaunchSpec(config={**base, "plan": "dp1", "name": "sharding-dp1",
                                  "training": {**base["training"], "global_batch": global_batch // n_ranks}},
                          run_root=run_root))
for name, job in {**jobs, "dp1": alone}.items():
    assert job.wait(timeout=300).state == "SUCCEEDED", (name, job.status().text())
records = {p: [e for e in read_events(jobs[p].run_dir, 0) if e["kind"] == "step"][-1].get("memory")
           for p in plans}
print({p: sorted(r) if r else None for p, r in records.items()})

# %%
def textbook(kind: str, n: int, psi: int) -> dict[str, float]:
    """Bytes per rank of weights, gradients and Adam's state (fp32) under each kind of data parallelism."""
    shard = {"ddp": (1, 1, 1), "zero1": (1, 1, n), "zero2": (1, n, n), "fsdp": (n, n, n)}[kind]
    return {"weights": 4 * psi / shard[0], "gradients": 4 * psi / shard[1], "optimizer": 8 * psi / shard[2]}


def measured_states(record: dict) -> dict[str, float]:
    return {"weights": record["params_bytes"] + record["unsharded_params_bytes"],
            "gradients": record["grads_bytes"], "optimizer": record["optimizer_bytes"]}


# %%
rows = {"ddp": textbook("ddp", n_ranks, psi), "zero1": textbook("zero1", n_ranks, psi),
        "zero2 (runtime)": measured_states(records[f"dp{n_ranks}-zero2"]),
        "fsdp (runtime)": measured_states(records[f"dp{n_ranks}-fsdp"])}
for kind, parts in rows.items():
    print(f"{kind:<16}" + "  ".join(f"{k} {v / 2**20:6.2f} MiB" for k, v in parts.items())
          + f"  total {sum(parts.values()) / 2**20:6.2f} MiB")

# %%
fig = go.Figure([go.Bar(name=part, x=list(rows), y=[rows[k][part] / 2**20 for k in rows])
                 for part in ("weights", "gradients", "optimizer")])
fig.update_layout(barmode="stack", title=f"Training state per rank, {n_ranks} ranks, Adam in fp32",
                  yaxis_title="MiB", template="plotly_white", height=340)
fig

# %% [markdown]
# What the runtime holds against the table. FSDP's weights, gradients and
# optimizer state are each $1/N$ of DDP's; ZeRO-2's gradients and optimizer
# state are, and its weights are whole. One thing differs from the
# textbook, and the check says by how much: the runtime builds ZeRO-2 on
# torch's FSDP2, which keeps each rank's own shard of the weights *beside*
# the gathered copy, $4\Psi/N$ more than the table's $4\Psi$.

# %%
fsdp, zero2 = rows["fsdp (runtime)"], rows["zero2 (runtime)"]
near = lambda a, b, band=0.02: abs(a / b - 1) <= band  # noqa: E731  (shards are padded to whole rows)
for part, want in textbook("fsdp", n_ranks, psi).items():
    assert near(fsdp[part], want), (part, fsdp[part], want)
assert near(zero2["gradients"], 4 * psi / n_ranks) and near(zero2["optimizer"], 8 * psi / n_ranks)
assert near(zero2["weights"], 4 * psi + 4 * psi / n_ranks)
saving = 1 - sum(fsdp.values()) / sum(rows["ddp"].values())
print(f"FSDP on {n_ranks} ranks holds {1 - saving:.3f} of DDP's state per rank (the table: 1/{n_ranks}); "
      f"ZeRO-2 {sum(zero2.values()) / sum(rows['ddp'].values()):.3f} (the table: "
      f"{sum(textbook('zero2', n_ranks, psi).values()) / sum(rows['ddp'].values()):.3f}, plus the kept shard)")

# %% [markdown]
# ## 3. DDP's buckets: hiding the all-reduce in the backward
#
# A gradient is final as soon as the backward has passed its layer, long
# before the backward ends. torch's DistributedDataParallel (DDP) groups
# gradients into **buckets** (DDP buckets) of about 25 MiB, in the order the backward
# produces them, and starts each bucket's all-reduce as soon as it is full,
# while the backward goes on with earlier layers. Only the last bucket's
# all-reduce is left when the backward ends. The runs above measure it: the
# backward of one rank alone (`dp1`, the same per-rank batch) against the
# backward of each DDP rank, which holds the bucket all-reduces.

# %%
import statistics


def backward_ms(job, rank: int = 0) -> float:
    events = [e for e in read_events(job.run_dir, rank) if e["kind"] == "stage" and e["op"] == "B"]
    return statistics.median(e["end"] - e["start"] for e in events[1:])


alone_ms, ddp_ms, ar_ms = backward_ms(alone), backward_ms(jobs[f"dp{n_ranks}"]), grads_ms[n_ranks]
hidden = (alone_ms + ar_ms - ddp_ms) / ar_ms
print(f"backward alone {alone_ms:.1f} ms; with DDP on {n_ranks} ranks {ddp_ms:.1f} ms; "
      f"the whole all-reduce by the formula {ar_ms:.1f} ms")

# %%
from IPython.display import Markdown, display

serial = alone_ms + ar_ms
display(Markdown(
    f"Run one after the other, the backward and the whole all-reduce would take {serial:.1f} ms; DDP's backward "
    f"took {ddp_ms:.1f} ms, " + (f"so {hidden:.0%} of the all-reduce was hidden behind the backward."
                                  if ddp_ms <= serial else
                                  f"{ddp_ms - serial:.1f} ms *more*: here nothing was hidden. ")
    + ("On this machine the two ranks share two cores with gloo's threads, which take cycles from the backward "
       "they overlap, and the rank alone had both cores to itself; on GPUs, whose communication runs beside "
       "their compute, the overlap pays." if hidden < 0.5 else "")))

# %% [markdown]
# ## 4. Recomputation: a second forward for less memory
#
# The backward needs what the forward computed: each layer's inputs and the
# intermediate values autograd saves. **Recomputation** (activation
# checkpointing) keeps only each layer's input in the forward and runs the
# forward again in the backward to get the rest back, about a third more
# compute for much less activation memory. `dp2-zero2-rc` is `dp2-zero2` with
# every layer recomputed.

# %%
plain, rc = records[f"dp{n_ranks}-zero2"], records[f"dp{n_ranks}-zero2-rc"]
step_ms = {p: statistics.median(jobs[p].metrics().query("rank == 0")["step_ms"].iloc[1:])
           for p in (f"dp{n_ranks}-zero2", f"dp{n_ranks}-zero2-rc")}
kept = rc["activations_peak_bytes"] / plain["activations_peak_bytes"]
slower = step_ms[f"dp{n_ranks}-zero2-rc"] / step_ms[f"dp{n_ranks}-zero2"]
assert kept < 0.5, kept  # the saved activations shrink to the layers' inputs
print(f"activations kept: {plain['activations_peak_bytes'] / 2**20:.2f} MiB without recomputation, "
      f"{rc['activations_peak_bytes'] / 2**20:.2f} MiB with it ({kept:.2f}x); step time {slower:.2f}x")

# %% [markdown]
# ## Exercises
#
# 1. **A 7B-parameter model** trained with Adam in fp32 on 8 GPUs of 80 GB.
#    Predict the training state per GPU under DDP, ZeRO-2 and FSDP, and say
#    which of them leave room for activations. Then run the solution.
# 2. **Latency or bandwidth?** Below some size an all-reduce costs mostly its
#    latency, above it mostly its bytes. Predict that size from the fitted
#    $\alpha$ and $\beta$ (where the two terms of the formula are equal), then
#    check it against the measured times: is the measured time at the next
#    size up less than twice the latency term?

# %% tags=["solution"]
# Exercise 1, one answer: the table's arithmetic for 7e9 parameters on 8 ranks.
gpu_gb, big = 80, 7_000_000_000
state_gb = {kind: sum(textbook(kind, 8, big).values()) / 1e9 for kind in ("ddp", "zero2", "fsdp")}
for kind, gb in state_gb.items():
    print(f"{kind:<6} {gb:6.1f} GB per GPU: " + ("does not fit" if gb > gpu_gb else f"{gpu_gb - gb:.1f} GB left"))
assert state_gb["ddp"] > gpu_gb > state_gb["zero2"] > state_gb["fsdp"]

# %% tags=["solution"]
# Exercise 2, one answer: the two terms of the ring formula are equal at B = N alpha beta (N ranks).
crossover = n_ranks * alpha_us * 1e-6 * beta_gbs * 1e9
latency_ms = 2 * (n_ranks - 1) * alpha_us * 1e-3
above = min((b for b in measured if b > crossover), default=max(measured))
print(f"latency and bytes cost the same at {crossover / 2**10:.0f} KiB; measured at {above / 2**10:.0f} KiB: "
      f"{measured[above]:.3f} ms, the latency term {latency_ms:.3f} ms")

# %% [markdown]
# The checks above hold this lesson's claims: large all-reduces grow with
# their bytes, the runtime's FSDP and ZeRO-2 ranks hold the shares of the
# training state the table gives (ZeRO-2 plus the shard FSDP2 keeps), and
# recomputation keeps less than half the activations. DDP's overlap is
# measured and stated as it came out on this machine.
