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
# # Scaling out: several nodes with torchrun, and Slurm
#
# Everything so far ran on one machine. A real job spans nodes, and the same
# notebook should start it there. The workbench describes a launch once, as a
# `LaunchSpec` (the run config, how many nodes, how many processes per node,
# where the run directory lives), and hands it to a **backend**:
#
# | backend | what it does |
# |---|---|
# | `local` | `torchrun` on this machine |
# | `multinode` | the same `torchrun` command on every node (over `ssh`), meeting through c10d rendezvous on the first |
# | `slurm` | an `sbatch` script: one task per node, each running `srun torchrun` |
# | `dryrun` | writes the run directory and shows exactly what the chosen place would run, starting nothing |
#
# This notebook shows the commands and the Slurm script for a two-node
# GroPipe job, shows the mistakes a spec refuses *before* anything starts,
# then runs the job for real on two "nodes" that are both this machine,
# talking over loopback exactly as two hosts would over the network, and
# submits it to Slurm where a cluster answers.
#
# Every term is defined in the [glossary](../docs/glossary.md), with the lesson that teaches it.

# %% tags=["parameters"]
# Parameters. WORKBENCH_SMOKE=1 (set by the test suite) trains fewer steps.
import os

from workbench.lessons.runs import is_smoke_run, lesson_run_root

smoke = is_smoke_run()
num_nodes = 2
train_steps = 12 if smoke else 30
optimizer = {"name": "adam", "lr": 0.001}
run_root = lesson_run_root()  # WORKBENCH_RUN_ROOT, or the project's runs/
# a Slurm job's run directory must be on storage every node sees (home or scratch, never /tmp)
shared_run_root = os.environ.get("WORKBENCH_SHARED_RUN_ROOT", os.path.expanduser("~/workbench-runs"))

# %%
from workbench.core.config import RunConfig
from workbench.core.rundir import COMMAND_FILE
from workbench.jobs import LaunchSpec, SlurmOptions, launch
from workbench.lessons.runs import repo_root
from workbench.viz.topology import topology_figure

REPO_ROOT = repo_root()  # the project folder, which holds launch/

# %% [markdown]
# ## 1. The job: GroPipe, one group per node
#
# `launch/gropipe_vgg.toml` runs 2 groups x 2 stages = 4 processes: its
# `[plan]` has `mesh = { dp = 2, pp = 2 }` and a GroPipe pipeline, and that
# mesh is the layout of the ranks (`config.plan.mesh`, a `Topology`). On two
# nodes with 2 processes each, torchrun numbers ranks node by node, so node 0
# holds ranks 0 and 1, the whole pipeline of group 0, and node 1 holds group 1.
# The activations of a pipeline, sent every micro-batch, stay inside a node;
# only each stage's gradient all-reduce, once per iteration, crosses the
# network. That placement is GroPipe's point.

# %%
config = RunConfig.from_toml(REPO_ROOT / "launch" / "gropipe_vgg.toml").replace(
    training={"steps": train_steps, "checkpoint_every": 0, "optimizer": optimizer})
layout = config.plan.mesh  # Topology(dp=2, pp=2): the groups are the dp axis, the stages the pp axis
print("plan:", config.plan.name)
assert (config.plan.family, config.plan.dp, config.plan.pp, config.world_size) == ("gropipe", 2, 2, 4)
per_node = config.world_size // num_nodes
for node in range(num_nodes):
    ranks = list(range(node * per_node, (node + 1) * per_node))
    print(f"node {node}: ranks {ranks} = " + ", ".join(f"group {layout.coord(r, 'dp')} stage {layout.coord(r, 'pp')}"
                                                      for r in ranks))
print("all-reduce groups (cross the nodes):", layout.groups("dp"))
topology_figure(layout, color_by="dp", title="4 ranks: one row per group, and one node per group")

# %% [markdown]
# ## 2. Multi-node torchrun, shown before it runs
#
# With real hosts the first one hosts the rendezvous and needs a port the
# others can reach. The dry run writes the run directory and returns the
# command each node would run; a remote node's command is wrapped in `ssh`,
# running in the same working directory (which, like the run directory, must
# be on a filesystem every node sees).

# %%
spec = LaunchSpec(config=config, nnodes=num_nodes, run_root=run_root, name="gropipe-2nodes")
print(f"{spec.nnodes} nodes x {spec.nproc_per_node} processes = world size {spec.world_size}")
remote = spec.replace(hosts=("node-a", "node-b"), rdzv_port=29400)
remote_dry = launch(remote, backend="dryrun")
for node, command in enumerate(remote_dry.commands):
    print(f"--- node {node} ---\n{command}\n")

# %% [markdown]
# ## 3. The same job through Slurm
#
# On a cluster with Slurm the spec carries `SlurmOptions`. The script asks for
# one task per node; each task runs `torchrun` with c10d rendezvous on the
# first node of the allocation, using the Slurm job id as the rendezvous id.
# On GPUs the backend is NCCL with one GPU per process. Its run directory
# goes on storage every node sees (`shared_run_root`).

# %%
slurm_spec = spec.replace(dist_backend="nccl", run_root=shared_run_root, slurm=SlurmOptions(
    partition="gpu", time="00:30:00", gpus_per_node=per_node, cpus_per_task=8,
    setup=("module load cuda/12.4", "source ~/venv/bin/activate")))
slurm_dry = launch(slurm_spec, backend="dryrun")
sbatch_script = (slurm_dry.run_dir / COMMAND_FILE).read_text()  # the run directory keeps the exact script
print(sbatch_script)

# %% [markdown]
# ## 4. Mistakes caught before anything starts
#
# A wrong spec on a cluster usually fails late: a world size that does not
# match the plan's mesh hangs in the first collective, a run directory on
# node-local disk is invisible to the other nodes, a GPU request short of the
# processes stalls NCCL. Each is refused here, with the field and the fix.

# %%
mistakes = {
    "3 nodes for 4 processes": lambda: LaunchSpec(config=config, nnodes=3, run_root=run_root),
    "run directory on node-local /tmp": lambda: launch(slurm_spec.replace(run_root="/tmp/runs"), backend="dryrun"),
    "fewer GPUs than processes": lambda: launch(slurm_spec.replace(slurm=SlurmOptions(gpus_per_node=1)),
                                                backend="dryrun"),
    "a remote head without a port": lambda: launch(spec.replace(hosts=("node-a", "node-b")), backend="dryrun"),
}
refusals = {}
for mistake, attempt in mistakes.items():
    try:
        attempt()
    except ValueError as error:
        refusals[mistake] = str(error)
    print(f"{mistake}:\n    {refusals.get(mistake, 'accepted (unexpected)')}")

# %% [markdown]
# ## 5. Two nodes for real, on loopback
#
# Without `hosts`, the `multinode` backend starts every node's torchrun agent
# on this machine, each bound to its own local address, meeting at a free port.
# Nothing else differs from the two-host case: separate agents, a c10d
# rendezvous, one world of 4 ranks, and per-node logs in the run directory.

# %%
job = launch(spec, backend="multinode")
print(job, "| rendezvous at", job.launch_info["rdzv_endpoint"])
job.monitor()

# %%
status = job.wait(timeout=400)
print(status.text())
print("exit code per node:", status.exit_codes)
metrics = job.metrics()
last_loss = metrics.groupby("rank")["loss"].last()
losses = metrics[metrics["rank"] == 0].sort_values("step")["loss"].tolist()
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps; last loss per rank: {last_loss.round(5).to_dict()}")

# %% [markdown]
# ## 6. The same job submitted to Slurm, when a cluster answers
#
# Where `sinfo` answers (a cluster's login node, or the one-host cluster that
# `scripts/ensure_slurm.sh` starts on this machine), the job goes to Slurm for
# real: `sbatch`, then `srun torchrun` on as many of its nodes as the job has
# (at most two), in the partition Slurm picks by default, on CPUs over gloo.
# Where nothing answers, nothing is submitted and the cell says so: the script
# of section 3 is what `sbatch` would get.

# %%
from workbench.lessons.scale_out import slurm_nodes, slurm_spec

cluster_nodes, why = slurm_nodes()  # usable nodes (idle, mixed, allocated, completing) in sinfo's answer, or 0
if cluster_nodes:  # on the spec's nodes when there are enough, else on one; over gloo; in Slurm's default partition
    live_spec = slurm_spec(spec, cluster_nodes, shared_run_root=shared_run_root, run_root=run_root)
    slurm_job = launch(live_spec, backend="slurm")
    slurm_job.backend.min_poll_s = 1.0  # ask the controller every second while we wait here (a monitor: every 5 s)
    print(f"submitted to Slurm: job {slurm_job.launch_info['slurm_job_id']}, {live_spec.nnodes} node(s) x "
          f"{live_spec.nproc_per_node} processes")
    slurm_status = slurm_job.wait(timeout=400)
    print(slurm_status.text())
    slurm_loss = slurm_job.metrics().query("rank == 0").sort_values("step")["loss"].iloc[-1]
    print(f"last loss {slurm_loss:.5f} through Slurm, {losses[-1]:.5f} on the loopback nodes")
else:
    print(f"no Slurm cluster answered here ({why}): nothing was submitted; section 3's script is what sbatch would get")

# %% [markdown]
# ## 7. Which stage goes on which node
#
# Across nodes the links are slower than inside one, so where each pipeline
# stage runs matters: a heavy boundary between two stages should not cross
# the slow inter-node link. Here a 4-stage pipeline on 2 nodes of 2 devices. `place` searches every assignment of stages to nodes and keeps the one
# with the least predicted communication; the naive node-major mapping is the
# alternative it rejects when it is worse.

# %%
from workbench.core.costs import ClusterSpec, LinkSpec
from workbench.planning.costs.clusters import get_cluster
from workbench.planning.partitioning.placement import place
from workbench.viz.placement import placement_figure

two_nodes = ClusterSpec("2 nodes x 2", 2, 2, get_cluster("2x8xH100-IB").device, LinkSpec("nvlink", 5.0, 300.0),
                        LinkSpec("ethernet", 20.0, 5.0))
boundary_bytes = [2_000_000, 16_000_000, 500_000, 0]  # the middle boundary is the heavy one
placement = place(boundary_bytes, two_nodes, num_microbatches=4)
print(placement.table())
placement_figure(placement, two_nodes)

# %% [markdown]
# ## Exercises
#
# 1. **Four nodes.** Predict what the dry run prints for the same job on 4
#    nodes of one process each: how many commands, and which host every
#    node's rendezvous points at. Check with `backend="dryrun"`.
# 2. **Make a mistake.** Predict the refusal for a spec that asks for 2 nodes
#    but gives 3 host names, then try it.

# %% tags=["solution"]
# Exercise 1, one answer: one command per node, every one pointing at the first host's rendezvous port.
four = spec.replace(nnodes=4, nproc_per_node=1, hosts=("node-a", "node-b", "node-c", "node-d"), rdzv_port=29400)
four_dry = launch(four, backend="dryrun")
print(f"{four.nnodes} nodes x {four.nproc_per_node} process = world size {four.world_size}; "
      f"{len(four_dry.commands)} commands")
assert len(four_dry.commands) == 4 and all("--rdzv-endpoint node-a:29400" in c for c in four_dry.commands)

# %% tags=["solution"]
# Exercise 2, one answer: the host list must name each node once.
try:
    launch(spec.replace(hosts=("node-a", "node-b", "node-c"), rdzv_port=29400), backend="dryrun")
    hosts_refusal = None
except ValueError as error:
    hosts_refusal = str(error)
print(hosts_refusal)
assert hosts_refusal is not None

# %% [markdown]
# The checks: the dry run rendered one `ssh`-wrapped command per remote node
# and an sbatch script for two nodes, every mistake was refused with a
# message, and the placement keeps the heavy boundary inside a node and beats
# the naive one; then the run: the two loopback nodes trained as one job:
# both agents exited cleanly, all four ranks report the same loss, and it
# fell. Where a Slurm cluster answered, the job it ran succeeded with the
# same loss.

# %%
assert len(remote_dry.commands) == num_nodes and all("--rdzv-endpoint node-a:29400" in c for c in remote_dry.commands)
assert remote_dry.commands[1].startswith("ssh node-b")
assert f"#SBATCH --nodes={num_nodes}" in sbatch_script and "srun --kill-on-bad-exit=1" in sbatch_script
assert '--rdzv-id "$SLURM_JOB_ID"' in sbatch_script
assert set(refusals) == set(mistakes), refusals
assert two_nodes.node_of(placement.device_of[1]) == two_nodes.node_of(placement.device_of[2])
assert placement.cost_ms < placement.naive_cost_ms

# %%
assert status.state == "SUCCEEDED", status.text()
assert status.exit_codes == {f"node{n}": 0 for n in range(num_nodes)}, status.exit_codes
assert sorted(last_loss.index) == list(range(config.world_size)) and last_loss.nunique() == 1
assert len(losses) == train_steps and sum(losses[-3:]) / 3 < losses[0] - 0.05, losses
if cluster_nodes:  # the same run through Slurm: it succeeded, with the loopback job's loss
    assert slurm_status.state == "SUCCEEDED", slurm_status.text()
    assert abs(slurm_loss - losses[-1]) < 1e-5, (slurm_loss, losses[-1])
print(f"scale-out lesson OK: {num_nodes} loopback nodes, {config.world_size} ranks, "
      f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
