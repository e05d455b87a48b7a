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
# # 2D tensor parallelism: a grid of devices multiplying blocks
#
# Pipelines cut a model *between* layers. Tensor parallelism cuts *inside*
# them: every weight matrix is split over several devices, which multiply
# their pieces and exchange partial results. Megatron's 1D scheme splits each
# matrix along one dimension over $P$ devices; every device still holds whole
# activations $[T, h]$, and each layer ends in an all-reduce of them.
#
# 2D tensor parallelism (Optimus, built on the SUMMA algorithm) arranges
# $P = q^2$ devices in a $q \times q$ grid and splits *both* weights and
# activations into $q \times q$ blocks. Each device keeps $1/q^2$ of every
# weight *and* of every activation, and talks only to its own grid row and
# column. This notebook
#
# 1. splits a transformer's MLP the 1D way first, by hand,
# 2. lays out the grid,
# 3. runs SUMMA by hand on small matrices and draws each of its steps,
# 4. compares 2D, 1D and dense with the cost model (memory, communication),
# 5. trains a tiny GPT-2 on a real $2 \times 2$ grid under `torchrun` and
#    checks, step by step, that it computes exactly what one dense process computes.
#
# Every term is defined in the [glossary](../docs/glossary.md), with the lesson that teaches it.

# %% tags=["parameters"]
# Parameters. WORKBENCH_SMOKE=1 (set by the test suite) trains fewer steps.
from workbench.lessons.runs import is_smoke_run, lesson_run_root

smoke = is_smoke_run()
q = 2                                  # grid side: q x q = 4 ranks
train_steps = 4 if smoke else 12       # steps of the real 2x2 run
run_root = lesson_run_root()           # WORKBENCH_RUN_ROOT, or the project's runs/

# %%
import numpy as np
import plotly.graph_objects as go

from workbench import Topology
from workbench.lessons.runs import repo_root
from workbench.viz.topology import topology_figure

REPO_ROOT = repo_root()  # the project folder, which holds launch/

# %% [markdown]
# ## 1. First, 1D: Megatron's split of an MLP
#
# A transformer's MLP is $Y = \mathrm{GeLU}(X A)\,B$ with $X$ of shape $[T, h]$,
# $A$ of $[h, 4h]$ and $B$ of $[4h, h]$. Megatron splits $A$ by **columns**
# over $P$ ranks: rank $p$ computes $\mathrm{GeLU}(X A_p)$ on its own, because
# GeLU works element by element and each column of $XA$ needs only its own
# column of $A$. Then it splits $B$ by **rows**, so rank $p$ can multiply the
# piece it already has, $\mathrm{GeLU}(X A_p) B_p$: a partial sum of $Y$.
# One all-reduce adds the $P$ partial sums, and every rank has the whole $Y$.
# Attention is split the same way, by heads. So per block: one all-reduce of
# $[T, h]$ forward and one backward (of the gradient of $X$), and every rank
# holds whole activations, which is what 2D will change.

# %%
P = q * q
T, h = 8, 4 * P
rng_1d = np.random.default_rng(1)
X = rng_1d.standard_normal((T, h))
A_mlp, B_mlp = rng_1d.standard_normal((h, 4 * h)) / h**0.5, rng_1d.standard_normal((4 * h, h)) / (4 * h)**0.5
gelu = lambda z: 0.5 * z * (1 + np.tanh(0.7978845608 * (z + 0.044715 * z**3)))  # noqa: E731
dense_Y = gelu(X @ A_mlp) @ B_mlp
partial_sums = [gelu(X @ A_p) @ B_p for A_p, B_p in zip(np.hsplit(A_mlp, P), np.vsplit(B_mlp, P))]
megatron_error = float(np.abs(sum(partial_sums) - dense_Y).max())  # the all-reduce is this sum
print(f"1D over {P} ranks: each holds A {A_mlp.shape[0]}x{A_mlp.shape[1] // P} and B {B_mlp.shape[0] // P}x"
      f"{B_mlp.shape[1]} ({1 / P:.0%} of the MLP's weights) but X and Y whole ({T}x{h}); the all-reduced partial "
      f"sums equal the dense MLP to {megatron_error:.1e}")

# %% [markdown]
# ## 2. The grid
#
# Rank $i q + j$ sits in grid row $i$ and column $j$. Its coordinates live on
# two named axes, `tp_row` and `tp_col`. SUMMA only ever broadcasts along a
# row (ranks sharing `tp_row`) or along a column (ranks sharing `tp_col`), so
# the grid's communicators are its $q$ rows and $q$ columns.

# %%
grid = Topology(tp_row=q, tp_col=q)
same_row = [[i * q + j for j in range(q)] for i in range(q)]
same_col = [[i * q + j for i in range(q)] for j in range(q)]
print(grid.describe())
print("grid rows (broadcast A blocks):   ", same_row)
print("grid columns (broadcast B blocks):", same_col)
topology_figure(grid, color_by="tp_row", title=f"A {q} x {q} tensor-parallel grid, coloured by grid row")

# %% [markdown]
# ## 3. SUMMA by hand
#
# To multiply $C = A B$, cut $A$, $B$ and $C$ into $q \times q$ blocks and give
# block $(i, j)$ of each to rank $(i, j)$. Block $C_{ij} = \sum_t A_{it} B_{tj}$
# needs a whole row of $A$ and a whole column of $B$, which no single rank has.
# SUMMA gets them in $q$ steps: at step $t$, rank $(i, t)$ broadcasts its
# $A_{it}$ along row $i$, rank $(t, j)$ broadcasts its $B_{tj}$ along column
# $j$, and every rank adds $A_{it} B_{tj}$ to its block of $C$. Here it is in
# numpy, one step at a time.

# %%
from workbench.lessons.tensor_parallel import blocks

rng = np.random.default_rng(0)
rows, inner, cols = 4 * q, 6 * q, 2 * q
A, B = rng.standard_normal((rows, inner)), rng.standard_normal((inner, cols))
A_blocks, B_blocks = blocks(A, q), blocks(B, q)  # A_blocks[i][j] lives on rank (i, j)
C_blocks = [[np.zeros((rows // q, cols // q)) for _ in range(q)] for _ in range(q)]
for t in range(q):  # rank (i, t) broadcasts A_{it} along row i, rank (t, j) broadcasts B_{tj} down column j
    for i in range(q):
        for j in range(q):
            C_blocks[i][j] += A_blocks[i][t] @ B_blocks[t][j]
summa_error = float(np.abs(np.block(C_blocks) - A @ B).max())
print(f"SUMMA on a {q}x{q} grid in {q} steps: largest difference from A @ B = {summa_error:.2e}")

# %% [markdown]
# Each panel is one SUMMA step on the grid. A cell shows what that rank
# multiplies at this step; the cells that *send* are coloured: blue sends its
# $A$ block along its row, orange its $B$ block down its column (a rank that
# sends both is purple).

# %%
from workbench.lessons.tensor_parallel import summa_broadcasts, summa_step_figure

for t, (row_senders, col_senders) in enumerate(summa_broadcasts(q)):
    print(f"step {t}: A blocks from {sorted(row_senders.values())}, B blocks from {sorted(col_senders.values())}")
summa_step_figure(q)

# %% [markdown]
# The runtime does exactly this for every linear layer of the model, forward
# and backward, as a schedule of SUMMA steps. The simulator draws one training
# step of a two-layer model on the grid: each forward (`F`) and backward (`B`)
# is split into $q$ SUMMA steps, each paying for its row and column broadcasts.

# %%
from workbench.scheduling import simulate, tensor2d_step
from workbench.viz.timeline import timeline_figure

step_schedule = tensor2d_step(q, num_layers=2)
step_result = simulate(step_schedule)
summa_steps = sum(1 for e in step_result.timeline if e.rank == 0 and e.op in ("F", "B"))
print(f"rank 0 runs {summa_steps} SUMMA steps per training step (2 layers x (F + B) x q = {2 * 2 * q})")
timeline_figure(step_result.timeline, title=f"One 2D tensor-parallel step on a {q}x{q} grid (2 layers)")

# %% [markdown]
# ## 4. What 2D buys, and what it costs
#
# The cost model (`workbench.planning.costs.tensor_costs`) gives per-rank memory and
# communication for GPT-2 small (124M parameters, 8 sequences of 1024 tokens)
# on 4 devices: dense on one device, 1D over 4, 2D on a $2 \times 2$ grid.
# Parameters split about equally in 1D and 2D; activations are where 2D wins,
# because 1D keeps every block's input and output whole on every rank. The
# price is many more, smaller collective calls, so 2D pays off when the link
# has low latency and memory is what limits you.

# %%
from workbench.lessons.tensor_parallel import comparison_table, memory_figure, per_rank_comparison
from workbench.planning.costs.tensor_costs import TransformerShape

gpt2_small = TransformerShape(hidden=768, heads=12, layers=12, vocab=50257, positions=1024, batch=8, seq=1024)
comparison = per_rank_comparison(gpt2_small, q)  # param_bytes_per_rank, activation_bytes_per_rank, collective_calls
print(comparison_table(comparison))
memory_figure(comparison, "GPT-2 small, memory per rank (MiB)")

# %% [markdown]
# Calls are what a slow-to-start link pays for; bytes are what a busy link
# pays for. Per rank and per step, 1D's all-reduces each move $2(P-1)/P$ of
# a block's activations, a share that only grows towards 2 as $P$ grows, so
# adding ranks never lowers 1D's traffic. 2D's SUMMA steps move blocks of
# the operands that shrink with the grid side $q = \sqrt{P}$. The same model,
# from 4 to 256 ranks:

# %%
from workbench.planning.costs.tensor_costs import step_volume_1d, step_volume_2d

GIB = 2**30
sides = (2, 4, 8, 16)
volume = {"1D": [step_volume_1d(gpt2_small, side * side)["total_bytes"] / GIB for side in sides],
          "2D": [step_volume_2d(gpt2_small, side)["total_bytes"] / GIB for side in sides]}
ranks = [side * side for side in sides]
for mode, values in volume.items():
    print(f"{mode}: " + ", ".join(f"{p} ranks {v:.2f} GiB" for p, v in zip(ranks, values)))
print(f"from {ranks[0]} to {ranks[-1]} ranks, 1D's traffic per rank changes {volume['1D'][-1] / volume['1D'][0]:.2f}x, "
      f"2D's {volume['2D'][-1] / volume['2D'][0]:.2f}x")
go.Figure([go.Scatter(x=ranks, y=values, name=mode, mode="lines+markers") for mode, values in volume.items()],
          layout={"title": "GPT-2 small: bytes each rank sends and receives per step", "height": 320,
                  "xaxis": {"title": "ranks (P)", "type": "log", "tickvals": ranks},
                  "yaxis": {"title": "GiB per rank", "rangemode": "tozero"}})

# %% [markdown]
# ## 5. Sequence and context parallelism: splitting the activations along the sequence
#
# 1D tensor parallelism splits the matrices, but the layer norms and
# dropouts between them still see whole activations $[s, b, h]$ on every
# rank. Per transformer layer, with $s$ tokens, batch $b$, hidden $h$ and $a$
# heads in 16-bit, the activations kept for the backward are about
# $sbh\,(34 + 5as/h)$ bytes (Korthikanti et al., 2022). With $t$-way tensor
# parallelism only the split parts shrink, $sbh\,(10 + 24/t + 5as/(ht))$;
# **sequence parallelism** also splits the layer norms and dropouts along
# the sequence, over the same $t$ ranks, so everything shrinks,
# $sbh\,(34/t + 5as/(ht))$, for the same communication (each all-reduce
# becomes a reduce-scatter plus an all-gather). **Context parallelism** splits
# the sequence over $c$ more ranks for the whole layer, attention included:
# each rank keeps $1/c$ of the tokens and receives the others' keys and values
# in a ring, so long contexts fit.

# %%
def layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False, c: int = 1) -> float:
    """Activation bytes one transformer layer keeps per rank (16-bit; Korthikanti et al. 2022), the sequence split
    over ``c`` context-parallel ranks."""
    s = s / c
    fixed = 34 / t if sp else 10 + 24 / t
    return s * b * h * (fixed + 5 * a * s / (h * t))


seqs = (1024, 4096, 16384)
layouts = {"no split": {}, "TP 4": {"t": 4}, "TP 4 + SP": {"t": 4, "sp": True}, "TP 4 + SP, CP 4": {"t": 4, "sp": True, "c": 4}}
per_layer = {name: [layer_activation_bytes(n, 1, 768, 12, **kw) / 2**20 for n in seqs] for name, kw in layouts.items()}
for name, values in per_layer.items():
    print(f"{name:<16}" + "  ".join(f"s={n}: {v:8.1f} MiB" for n, v in zip(seqs, values)))

# %%
fig = go.Figure([go.Scatter(x=list(seqs), y=values, name=name, mode="lines+markers") for name, values in per_layer.items()])
fig.update_layout(title="GPT-2 small, one layer's activations per rank at batch 1", xaxis_type="log", yaxis_type="log",
                  xaxis_title="sequence length s", yaxis_title="MiB per rank", template="plotly_white", height=340)
assert all(a > b > c > d for a, b, c, d in zip(*per_layer.values()))  # each split keeps less
long_ratio = per_layer["TP 4 + SP"][-1] / per_layer["TP 4 + SP, CP 4"][-1]
assert 4 <= long_ratio <= 16  # context parallelism over 4: at least 4x less, up to 16x on the quadratic term
print(f"at s={seqs[-1]}, context parallelism over 4 ranks keeps {long_ratio:.1f}x less per rank")
fig

# %% [markdown]
# ## 6. A real 2 x 2 run, checked against dense
#
# `launch/tensor2d_gpt2.toml` trains a tiny GPT-2 (hidden 64, 2 blocks, byte
# vocabulary) on a $2 \times 2$ grid. Its parallel plan is the `[plan]` table
# `mesh = { dp = 1, tp_row = 2, tp_col = 2 }`: no pipeline, one copy of the
# model (`dp = 1`) split over a square grid of `tp_row` x `tp_col` ranks, so
# every layer is 2D tensor parallel over 4 ranks. Its name is `tp2d-2x2-dp1`,
# and a config takes that name in place of the table; below we give it for the
# grid side `q` of this notebook. We launch it under `torchrun` (4 processes,
# gloo) and watch it in the job monitor.

# %%
from workbench.core.config import RunConfig
from workbench.jobs import LaunchSpec, launch

base = RunConfig.from_toml(REPO_ROOT / "launch" / "tensor2d_gpt2.toml")
config = base.replace(training={"steps": train_steps}, plan=f"tp2d-{q}x{q}-dp1")
print("plan:", config.plan.name, config.plan.to_dict()["mesh"], "| world size", config.world_size)
job = launch(LaunchSpec(config=config, run_root=run_root, name="tensor2d-lesson"))
print(job)
job.monitor()

# %% [markdown]
# While the grid trains, we run the same training in this kernel, on one
# process, with the dense model the grid was cut from: the same seed, the same
# batches, the same loss and optimizer. If the grid multiplies its blocks
# correctly, every step's loss agrees to rounding.

# %%
import torch

from workbench.lessons.tensor_parallel import dense_twin
from workbench.runtime.strategies.base import make_optimizer

torch.set_num_threads(1)
dense, batches = dense_twin(config)  # the model the grid was cut from, and the run's batches in order
optimizer = make_optimizer(list(dense.parameters()), config)
dense_losses = []
for _, (token_ids, _targets) in zip(range(config.training.steps), batches):
    optimizer.zero_grad(set_to_none=True)
    loss = dense(token_ids, labels=token_ids).loss  # next-token loss over [B, s] byte ids
    loss.backward()
    optimizer.step()
    dense_losses.append(loss.item())

# %% [markdown]
# Now wait for the grid and set the two side by side.

# %%
status = job.wait(timeout=300)
print(status.text())
grid_losses = job.metrics().query("rank == 0").sort_values("step")["loss"].tolist()
largest_gap = max(abs(a - b) for a, b in zip(grid_losses, dense_losses))
print(f"{'step':>4}{'2x2 grid':>12}{'dense':>12}")
for step, (a, b) in enumerate(zip(grid_losses, dense_losses), start=1):
    print(f"{step:>4}{a:>12.6f}{b:>12.6f}")
print(f"largest difference over {len(grid_losses)} steps: {largest_gap:.2e}")
go.Figure([go.Scatter(y=grid_losses, name=f"{q}x{q} grid (torchrun)", mode="lines+markers"),
           go.Scatter(y=dense_losses, name="dense (this kernel)", mode="lines", line={"dash": "dash"})],
          layout={"title": "Loss per step: the grid and the dense model", "xaxis_title": "step - 1",
                  "yaxis_title": "loss", "height": 320})

# %% [markdown]
# ## Exercises
#
# 1. **Where the lines cross.** From section 4's volumes, predict the
#    smallest grid at which 2D moves fewer bytes per rank than 1D on the same
#    number of ranks, then check it over grid sides 2 to 16.
# 2. **1D the other way round.** Split $A$ by rows and $B$ by columns
#    instead. Predict whether the partial results still add up to $Y$ with
#    one all-reduce, then check with the matrices of section 1. (GeLU is the
#    catch.)

# %% tags=["solution"]
# Exercise 1, one answer: the first grid side where 2D's bytes per rank fall below 1D's.
per_side = {side: (step_volume_1d(gpt2_small, side * side)["total_bytes"], step_volume_2d(gpt2_small, side)["total_bytes"])
            for side in range(2, 17)}
crossing = next((side for side, (one, two) in per_side.items() if two < one), None)
print(f"2D moves fewer bytes per rank than 1D from a {crossing} x {crossing} grid ({crossing * crossing} ranks) on"
      if crossing else "2D never moves fewer bytes per rank than 1D up to 16 x 16")
assert crossing is None or all(two < one for side, (one, two) in per_side.items() if side >= crossing)

# %% tags=["solution"]
# Exercise 2, one answer: row-split A gives partial sums of XA, and GeLU of a partial sum is not a partial GeLU.
rows_first = [gelu(X[:, k] @ A_k) for k, A_k in zip(np.array_split(np.arange(h), P), np.vsplit(A_mlp, P))]
wrong = sum(rows_first) @ B_mlp
error = float(np.abs(wrong - dense_Y).max())
print(f"summing GeLU of the partial products misses the dense MLP by {error:.2f}: the sum must come before GeLU, "
      f"so this split needs an all-reduce in the middle of the MLP as well")
assert error > 1e-3

# %% [markdown]
# The checks: Megatron's split and SUMMA by hand reproduce the dense products, the cost model's 2D
# activations are smaller than 1D's, 1D's traffic per rank never falls as
# ranks are added while 2D's falls each time, the real grid run finished with every
# step reported, its loss fell, and it matches the dense model within 1e-4 at
# every step.

# %%
assert megatron_error < 1e-9, megatron_error
assert summa_error < 1e-9, summa_error
assert summa_steps == 2 * 2 * q
assert comparison["2d"]["activations_mib"] < comparison["1d"]["activations_mib"] < comparison["dense"]["activations_mib"]
assert all(a <= b for a, b in zip(volume["1D"], volume["1D"][1:])), volume  # 1D's traffic never falls with P
assert all(a > b for a, b in zip(volume["2D"], volume["2D"][1:])), volume   # 2D's falls at every step
assert status.state == "SUCCEEDED", status.text()
assert len(grid_losses) == len(dense_losses) == config.training.steps
assert grid_losses[-1] < grid_losses[0], grid_losses
assert largest_gap < 1e-4, (grid_losses, dense_losses)
print(f"2D lesson OK: {q}x{q} grid equals dense over {config.training.steps} steps "
      f"(largest gap {largest_gap:.1e}), loss {grid_losses[0]:.3f} -> {grid_losses[-1]:.3f}")
