"""Every strategy on CUDA through the real launcher: bf16 runs train, fp32 runs equal the CPU reference.

Each run is a ``workbench.jobs.launch`` of the training entry under
torchrun. Two ranks that share one GPU run on gloo (NCCL refuses them);
gloo moves CUDA tensors through host memory for all-reduce, broadcast and
all-gather but has no point-to-point send and receive for them, so plans
with a pipeline, tensor parallelism or sharded layers need one GPU per rank
and are skipped, naming the count, on a machine with fewer. Plain data
parallelism runs on any number of GPUs.

fp32 runs force ``precision = "fp32"`` (``auto`` means bf16 on CUDA) and are
compared, within a loose tolerance (the same arithmetic in a different order
on a different device), with the single-process CPU reference: the dense
model trained in one process, or for the tensor-parallel strategies, whose
sharded GPT-2 is built by its own package, the same run launched on CPUs.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from runtime_launch import dumped_params, stashing_reference, step_losses  # noqa: E402
from workbench.core.config import RunConfig, runs_layer_by_layer  # noqa: E402
from workbench.core.plan import ParallelPlan  # noqa: E402
from workbench.jobs import LaunchSpec, launch  # noqa: E402
from workbench.runtime.events import read_events  # noqa: E402
from workbench.runtime.groups import choose_backend  # noqa: E402
from workbench.runtime.reference import reference_train  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multiproc, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

MLP = {"model": "mlp", "global_batch": 16}
GPT2 = {"model": "gpt2-tiny", "data": {"kind": "bytes-lm", "seq_len": 16}, "global_batch": 8,
        "model_overrides": {"n_layer": 2, "seq_len": 16, "n_head": 4, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                            "attn_pdrop": 0.0}}
COMMON = {"steps": 4, "seed": 3, "dump_params": True, "collective_timeout_s": 120.0, "tensorboard": False,
          "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}
LOOSE = {"rtol": 1e-3, "atol": 1e-4}


def gpus_needed(plan: str) -> int:
    """GPUs a plan's ranks need on one node: one per rank unless it only all-reduces and broadcasts (plain DDP)."""
    parsed = ParallelPlan.parse(plan)
    if parsed.family == "dp" and not runs_layer_by_layer(parsed):
        return 1
    return parsed.world_size


def require_gpus(plan: str) -> None:
    needed, present = gpus_needed(plan), torch.cuda.device_count()
    if present < needed:
        pytest.skip(f"{plan} needs {needed} GPUs (one per rank, NCCL): its ranks exchange CUDA tensors point to "
                    f"point or by collectives gloo lacks for them; this machine has {present}")


def launch_run(root: Path, fields: dict, *, device: str = "cuda", timeout: float = 240.0) -> RunConfig:
    """One launched run of ``fields`` on ``device``; returns its config with ``run_dir`` set, after it succeeded."""
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in fields["plan"])[:48]
    job = launch(LaunchSpec(config={**COMMON, **fields, "device": device, "name": name}, name=name,
                            run_root=str(root)))
    status = job.wait(timeout=timeout)
    if not status.finished:
        job.cancel()
    assert status.state == "SUCCEEDED", (f"{fields['plan']}: {status.state} {status.reason}\n"
                                         + "\n".join(job.logs(tail=60)))
    config = RunConfig.from_json(job.run_dir / "config.json")
    return config.replace(run_dir=str(job.run_dir))


def start_event(run_dir: Path, rank: int) -> dict:
    return next(e for e in read_events(run_dir, rank) if e["kind"] == "start")


def assert_backend_as_chosen(config: RunConfig) -> None:
    """Each rank's start event names the backend the choice rule gives for this node and its device."""
    run_dir = Path(config.run_dir)
    expected = choose_backend("cuda", config.world_size, torch.cuda.device_count())
    for rank in range(config.world_size):
        start = start_event(run_dir, rank)
        assert start["backend"] == expected, (rank, start["backend"])
        assert start["device"].startswith("cuda"), start["device"]


def assert_close_to(run_dir: Path, config: RunConfig, expected_params: dict[str, torch.Tensor],
                    expected_losses: list[float] | None) -> None:
    if expected_losses is not None:
        torch.testing.assert_close(step_losses(run_dir), expected_losses, **LOOSE)
    params = dumped_params(run_dir, list(range(config.world_size)))
    assert sorted(params) == sorted(expected_params)
    for name, value in expected_params.items():
        torch.testing.assert_close(params[name].cpu(), value, **LOOSE, msg=f"parameter {name}")


# -- bf16 autocast: every kind of runtime trains with finite losses ---------------------------------------------------

BF16_RUNS = [
    ("pp2-1f1b-m4", MLP),
    ("gropipe-1x2-1f1b-m4-d1", MLP),
    ("async-1x2-m4", MLP),
    ("dp2-m2", MLP),
    ("dp2-m2-L[0-1=fsdp;2-3=ddp]", MLP),  # per-layer options: the layer-by-layer runtime
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("plan", "base"), BF16_RUNS, ids=[p for p, _ in BF16_RUNS])
def test_bf16_run_trains_with_finite_losses(tmp_path, plan, base):
    require_gpus(plan)
    config = launch_run(tmp_path, {**base, "plan": plan, "precision": "bf16"})
    run_dir = Path(config.run_dir)
    losses = step_losses(run_dir)
    assert len(losses) == config.steps and all(math.isfinite(x) for x in losses), losses
    steps = [e for e in read_events(run_dir, 0) if e["kind"] == "step"]
    assert all(e["memory_bytes"] > 0 for e in steps)  # the CUDA allocator's high-water mark
    assert_backend_as_chosen(config)
    assert json.loads((run_dir / "config.json").read_text())["precision"] == "bf16"


# -- fp32: every strategy equals the single-process CPU reference --------------------------------------------------

FP32_RUNS = [
    ("dp2-m2", MLP),
    ("pp2-gpipe-m2", MLP),
    ("pp2-1f1b-m4", MLP),
    ("pp2-interleaved-v2-m4", MLP),
    ("torchpp2-1f1b-m4", MLP),
    ("gropipe-1x2-1f1b-m4-d0", MLP),
    ("async-1x2-m4-if1", MLP),  # one iteration in flight: the synchronous rule
    ("dp2-m2-L[0-1=fsdp;2-3=ddp]", MLP),
    ("tp1d-2-dp1", GPT2),
    ("tp2d-2x2-dp1", GPT2),
]


def cpu_reference(root: Path, config: RunConfig, fields: dict) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Final parameters and losses of the single-process reference, or of the same run on CPUs (tensor parallel)."""
    if config.plan.family in ("tp1d", "tp2d"):
        on_cpu = launch_run(root / "cpu", fields, device="cpu")
        return dumped_params(Path(on_cpu.run_dir), list(range(on_cpu.world_size))), step_losses(Path(on_cpu.run_dir))
    reference = reference_train(config)
    return reference.params, reference.losses


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("plan", "base"), FP32_RUNS, ids=[p for p, _ in FP32_RUNS])
def test_fp32_run_equals_the_cpu_reference(tmp_path, plan, base):
    require_gpus(plan)
    fields = {**base, "plan": plan, "precision": "fp32"}
    config = launch_run(tmp_path / "cuda", fields)
    params, losses = cpu_reference(tmp_path, config, fields)
    assert_close_to(Path(config.run_dir), config, params, losses)
    assert_backend_as_chosen(config)


@pytest.mark.timeout(300)
def test_fp32_async_pipeline_equals_the_weight_stashing_rule(tmp_path):
    plan = "async-1x2-m4"
    require_gpus(plan)
    config = launch_run(tmp_path, {**MLP, "plan": plan, "precision": "fp32"})
    assert_close_to(Path(config.run_dir), config, stashing_reference(config), None)


# -- ranks that share a GPU ------------------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_a_pipeline_on_a_shared_gpu_is_refused_with_the_reason(tmp_path):
    if torch.cuda.device_count() >= 2:
        pytest.skip("needs a machine with exactly 1 GPU, so that two ranks share it")
    job = launch(LaunchSpec(config={**COMMON, **MLP, "plan": "pp2-1f1b-m4", "device": "cuda"}, name="shared",
                            run_root=str(tmp_path)))
    status = job.wait(timeout=240)
    if not status.finished:
        job.cancel()
    assert status.state == "FAILED", status.state
    assert "gloo backend cannot do for CUDA tensors" in json.dumps(status.root_cause), status.root_cause
