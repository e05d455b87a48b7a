"""Every strategy family with its messages and collectives staged through host memory equals its reference.

Ranks that share a GPU run on the ``staged`` backend (host copies, gloo on
them, results copied back). Forced on CPU ranks (``dist_backend =
"staged"``) the same code runs without a GPU: pipelines, GroPipe (its
delayed all-reduce too) and the asynchronous pipeline on 2 and 4 ranks, and
plain DDP and a per-layer plan of FSDP2, DTensor tensor parallelism and
recomputation, each against the single-process reference (or the weight
stashing rule applied by hand), at 1e-5. Each rank's start event names the
backend it ran on.
"""

from __future__ import annotations

import pytest
import torch

from runtime_launch import Sweep, dumped_params, plan_id, stashing_reference, step_losses
from workbench.runtime.events import read_events
from workbench.runtime.reference import reference_train

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

SGD = {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}
GPT2 = {"model": {"name": "gpt2-tiny", "overrides": {"n_layer": 2, "seq_len": 16, "resid_pdrop": 0.0,
                                                    "embd_pdrop": 0.0, "attn_pdrop": 0.0}},
        "data": {"kind": "bytes-lm", "seq_len": 16}, "training": {"global_batch": 8, "steps": 3, **SGD}}

# (plan, ranks, config fields, what it must equal)
RUNS = [
    ("pp2-1f1b-m4", 2, {}, "reference"),
    ("pp4-1f1b-m4", 4, {"training": SGD}, "reference"),
    ("gropipe-1x2-gpipe-m4-d0", 2, {"training": SGD}, "reference"),
    ("gropipe-2x2-1f1b-m4-d1", 4, {"training": SGD}, "delayed"),  # the all-reduce overlaps the next iteration
    ("async-1x2-m4", 2, {"training": {**SGD, "steps": 4}}, "stashing"),
    ("async-1x4-m4-2bw-if4", 4, {"training": {**SGD, "steps": 4}}, "stashing"),
    ("dp2-m2", 2, {"training": {"grad_accum": 2}}, "reference"),  # torch DDP's reducer on the staged group
    ("tp1d-2-dp2-m2-L[0=ddp;1=fsdp.tp1d2.rc;2=ddp.tp1d2;3=zero2]", 4, GPT2, "reference"),
]


def expected_params(config, kind: str) -> tuple[dict[str, torch.Tensor], list[float] | None]:
    if kind == "stashing":
        return stashing_reference(config), None
    reference = reference_train(config, delay=1) if kind == "delayed" else reference_train(config)
    return reference.params, reference.losses


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The module's runs on the staged backend, one sweep per process count (2 and 4 ranks)."""
    return Sweep(tmp_path_factory.mktemp("staged"), {plan: (ranks, {"plan": plan, **fields})
                                                    for plan, ranks, fields, _ in RUNS}, dist_backend="staged")


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("plan", "ranks", "fields", "kind"), RUNS, ids=[plan_id(r[0]) for r in RUNS])
def test_staged_run_equals_its_reference(sweep, plan, ranks, fields, kind):
    config, run_dir = sweep.run(plan), sweep.dir(plan)
    assert config.world_size == ranks
    for rank in range(ranks):
        start = next(e for e in read_events(run_dir, rank) if e["kind"] == "start")
        assert (start["backend"], start["device"]) == ("staged", "cpu"), rank
    params, losses = expected_params(config, kind)
    if losses is not None:
        torch.testing.assert_close(step_losses(run_dir), losses, rtol=0, atol=1e-5)
    dumped = dumped_params(run_dir, list(range(ranks)))
    assert sorted(dumped) == sorted(params)
    for name, value in params.items():
        torch.testing.assert_close(dumped[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")
