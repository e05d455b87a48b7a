"""Plan names: the canonical text form of a plan (:attr:`ParallelPlan.name`) and its parser.

A pipeline kind's part of a name is its spec's (``PipelineSpec.head`` and
``tokens`` write it, ``head_pattern`` and ``take_token`` read it); the heads
of plans without a pipeline (``dp8``, ``tp2d-2x2-dp2``, ``tp1d-4-dp2``), the
tensor-parallel and data-parallel words and the per-layer runs
(``-L[0-3=ddp.rc;4-9=ddp]``) are read here. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from .layer_plan import _DP_TEXT, _TEXT_DP, LayerPlan, _mesh_layer
from .pipelines import PIPELINE_KINDS, NoPipeline, plan_error
from .topology import Topology

__all__ = ["plan_name", "plan_fields_from_name"]


def plan_name(plan: Any) -> str:
    """The canonical name of a :class:`~workbench.core.plan.ParallelPlan`, which :func:`plan_fields_from_name` reads."""
    spec, dp, m = plan.pipeline, plan.dp, plan.microbatches
    if isinstance(spec, NoPipeline):
        if plan.tp_kind == "2d":
            head = f"tp2d-{plan.q}x{plan.q}-dp{dp}"
        elif plan.tp_kind == "1d":
            head = f"tp1d-{plan.tp}-dp{dp}"
        else:
            head = f"dp{dp}"
        tokens = [f"m{m}"] if m > 1 else []
    else:
        head, tokens = spec.head(plan), spec.tokens()
        if plan.tp_kind == "2d":
            tokens.append(f"tp2d{plan.q}x{plan.q}")
        elif plan.tp_kind == "1d":
            tokens.append(f"tp1d{plan.tp}")
    text = "-".join([head, *tokens]) + _layers_suffix(plan)
    return text if plan.partition == "uniform" else f"{text}@{plan.partition}"


def _layers_suffix(plan: Any) -> str:
    base = plan._implied
    if plan.is_uniform:
        layer = plan.layers[0]
        if layer.tp == base.tp and layer.tp_degree == base.tp_degree:
            words = ([] if layer.dp == "replicate" else [_DP_TEXT[layer.dp]]) + (["rc"] if layer.recompute else [])
            return "".join(f"-{w}" for w in words)
        return f"-L[all={layer.text}]"
    runs, start, layers = [], 0, plan.layers
    for i in range(1, len(layers) + 1):
        if i == len(layers) or (layers[i] is not layers[start] and layers[i] != layers[start]):
            span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            runs.append(f"{span}={layers[start].text}")
            start = i
    return f"-L[{';'.join(runs)}]"


_PLAIN_HEAD_RE = re.compile(r"dp(?P<dp>\d+)|tp2d-(?P<q>\d+)x(?P<q2>\d+)-dp(?P<qdp>\d+)|tp1d-(?P<t>\d+)-dp(?P<tdp>\d+)")
_EXAMPLES = ("'dp8', 'gropipe-2x4-1f1b-m8-d1', 'pp4-1f1b-m8', 'pp4-zbh1-m8', 'pp4-interleaved-v2-m8', 'async-2x4-m8', "
             "'torchpp2-1f1b-m4', 'tp2d-2x2-dp2', 'tp1d-4-dp2' (optionally with '-rc', '-fsdp', '-zero2', "
             "'-L[0-3=ddp.rc;4-9=ddp]' and '@0-3|4-9')")


def _match_head(body: str) -> tuple[dict[str, int], int, Any, int] | None:
    """(mesh sizes, micro-batches, pipeline spec class + options or NoPipeline, end of the head) or None."""
    for cls in PIPELINE_KINDS.values():
        if cls is NoPipeline:
            continue
        match = re.match(cls.head_pattern(), body)
        if match and (match.end() == len(body) or body[match.end()] == "-"):
            mesh, m, options = cls.from_head(match.groupdict())
            return mesh, m, (cls, options), match.end()
    match = _PLAIN_HEAD_RE.match(body)
    if not match or (match.end() < len(body) and body[match.end()] != "-"):
        return None
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "dp" in g:
        mesh = {"dp": g["dp"]}
    elif "q" in g:
        if g["q"] != g["q2"]:
            raise ValueError(f"2D tensor grids are square, got {g['q']}x{g['q2']}")
        mesh = {"dp": g["qdp"], "tp_row": g["q"], "tp_col": g["q"]}
    else:
        mesh = {"dp": g["tdp"], "tp": g["t"]}
    return mesh, 1, (NoPipeline, {}), match.end()


def plan_fields_from_name(text: str) -> dict[str, Any]:
    """The fields of the plan a name stands for (``ParallelPlan(**fields)`` checks them as a whole)."""
    def bad(why: str) -> ValueError:
        return plan_error("name", text, f"{why}; expected e.g. {_EXAMPLES}")

    body, _, partition = text.partition("@")
    layers_text = None
    m_layers = re.search(r"-L\[([^\]]*)\]$", body)
    if m_layers:
        layers_text, body = m_layers.group(1), body[:m_layers.start()]
    try:
        head = _match_head(body)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if head is None:
        raise bad("unknown plan name")
    mesh, m, (spec_cls, options), end = head
    mesh.setdefault("pp", 1)
    uniform = LayerPlan()
    for token in [t for t in body[end:].split("-") if t]:
        tp1 = re.fullmatch(r"tp1d(\d+)", token)
        tp2 = re.fullmatch(r"tp2d(\d+)x(\d+)", token)
        if spec_cls.take_token(token, options):
            continue
        if re.fullmatch(r"m\d+", token) and spec_cls is NoPipeline:
            m = int(token[1:])
        elif tp1 and "tp" not in mesh and "tp_row" not in mesh:
            mesh["tp"] = int(tp1.group(1))
        elif tp2 and "tp" not in mesh and "tp_row" not in mesh:
            if tp2.group(1) != tp2.group(2):
                raise bad(f"2D tensor grids are square, got {token!r}")
            mesh.update(tp_row=int(tp2.group(1)), tp_col=int(tp2.group(2)))
        elif token in ("fsdp", "zero2"):
            uniform = replace(uniform, dp=_TEXT_DP[token])
        elif token == "rc":
            uniform = replace(uniform, recompute=True)
        else:
            raise bad(f"unknown part {token!r}")
    topology = Topology(tuple(mesh.items()))
    implied = _mesh_layer(topology)
    uniform = replace(uniform, tp=implied.tp, tp_degree=implied.tp_degree)
    layers: tuple[LayerPlan, ...] = (uniform,)
    if layers_text is not None:
        if uniform != LayerPlan(tp=uniform.tp, tp_degree=uniform.tp_degree):
            raise bad("give layer options either as '-rc'/'-fsdp'/'-zero2' or in '-L[...]', not both")
        layers = _parse_layer_runs(layers_text, bad)
    return dict(mesh=topology, pipeline={"kind": spec_cls.kind, **options}, microbatches=m,
                partition=partition or "uniform", layers=layers)


def _parse_layer_runs(text: str, bad) -> tuple[LayerPlan, ...]:
    out: list[LayerPlan] = []
    runs = [r for r in text.split(";") if r.strip()]
    for run in runs:
        span, sep, option = run.partition("=")
        if not sep:
            raise bad(f"layer run {run!r} needs 'range=option'")
        layer = LayerPlan.parse(option)
        if span.strip() == "all":
            if len(runs) != 1:
                raise bad("'all' must be the only layer run")
            return (layer,)
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", span.strip())
        if not m or int(m.group(1)) != len(out) or int(m.group(2) or m.group(1)) < int(m.group(1)):
            raise bad(f"layer runs must be consecutive from layer 0; got {span!r} after {len(out)} layers")
        out.extend([layer] * (int(m.group(2) or m.group(1)) - int(m.group(1)) + 1))
    if not out:
        raise bad("'-L[...]' lists no layers")
    return tuple(out)
