"""Cut an arbitrary module into a chain at its top-level children, or say why not.

A model is a valid layer chain only if, at every cut point, exactly one value
produced before the cut is needed after it. A skip connection that jumps from
one top-level child over another breaks that: cutting there would silently
drop the skipped value, and a profile of the "chain" would time a different
model. This module traces the module's ``forward`` with ``torch.fx`` (keeping
the top-level children opaque), assigns every graph node to a unit (a child
call, or glue such as ``torch.flatten`` joining the unit of its latest input),
checks every cut, and only then splits the graph into one sub-module per unit
with ``torch.fx.passes.split_module``. The sub-modules call the original
children, so the weights are shared with the model.
"""

from __future__ import annotations

import torch.fx as fx
from torch import nn
from torch.fx.passes.split_module import split_module

__all__ = ["split_at_children", "split_at_points"]


class _ChildTracer(fx.Tracer):
    """Keeps the named submodules of the traced root (its top-level children, or split points) as opaque calls."""

    def __init__(self, child_names: set[str]) -> None:
        super().__init__()
        self.child_names = child_names

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name in self.child_names or super().is_leaf_module(m, module_qualified_name)


def _trace(module: nn.Module, leaves: set[str] | None = None) -> fx.GraphModule:
    tracer = _ChildTracer({name for name, _ in module.named_children()} if leaves is None else leaves)
    try:
        graph = tracer.trace(module)
    except Exception as exc:  # fx raises many kinds (TraceError, TypeError, RuntimeError...)
        raise ValueError(
            f"cannot sequence {type(module).__name__}: its forward is not traceable with torch.fx "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "build the layers by hand with LayerSequence.from_sequential") from exc
    return fx.GraphModule(module, graph)


def _assign_units(graph: fx.Graph, model_name: str) -> tuple[dict[fx.Node, int], list[str]]:
    """Unit index of every node (-1: the input, len(units): the output)."""
    unit_of: dict[fx.Node, int] = {}
    unit_names: list[str] = []
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise ValueError(f"cannot sequence {model_name}: forward takes {len(placeholders)} inputs "
                         f"({[p.target for p in placeholders]}); a layer chain takes exactly one tensor")
    constants: list[fx.Node] = []
    for node in graph.nodes:
        if node.op == "placeholder":
            unit_of[node] = -1
        elif node.op == "call_module" and "." not in str(node.target):
            if node.target in unit_names:
                raise ValueError(f"cannot sequence {model_name}: child {node.target!r} is called more than once; "
                                 "a layer chain calls each top-level child once")
            unit_names.append(str(node.target))
            unit_of[node] = len(unit_names) - 1
        elif node.op == "output":
            continue
        else:
            inputs = [unit_of[a] for a in node.all_input_nodes if a in unit_of and a not in constants]
            if inputs:
                unit_of[node] = max(max(inputs), 0)
            else:
                constants.append(node)
    if not unit_names:
        raise ValueError(f"cannot sequence {model_name}: its forward calls no child module")
    for node in graph.nodes:
        if node.op == "output":
            unit_of[node] = len(unit_names)
    for node in reversed(constants):
        unit_of[node] = min((unit_of[u] for u in node.users), default=0)
    return unit_of, unit_names


def _check_cuts(graph: fx.Graph, unit_of: dict[fx.Node, int], unit_names: list[str], model_name: str,
                constants: set[fx.Node]) -> None:
    """Every cut must be crossed by exactly one value: the output of the unit before it."""
    def label(node: fx.Node) -> str:
        owner = "the input" if unit_of[node] < 0 else f"unit {unit_names[unit_of[node]]!r}"
        return f"{node.name!r} (from {owner})"

    placeholder = next(n for n in graph.nodes if n.op == "placeholder")
    late_users = sorted({unit_names[min(unit_of[u], len(unit_names) - 1)] for u in placeholder.users if unit_of[u] > 0})
    if late_users:
        raise ValueError(f"cannot sequence {model_name}: the input is used by units {late_users}, "
                         f"not only by the first unit {unit_names[0]!r}")
    for cut in range(len(unit_names) - 1):
        crossing = [n for n in graph.nodes if n not in constants and n.op != "output" and unit_of[n] <= cut
                    and any(unit_of[u] > cut for u in n.users)]
        if len(crossing) != 1 or unit_of[crossing[0]] != cut:
            where = f"after unit {unit_names[cut]!r} (before {unit_names[cut + 1]!r})"
            values = ", ".join(label(n) for n in crossing) or "nothing"
            raise ValueError(
                f"cannot sequence {model_name}: a branch crosses the cut {where}: {len(crossing)} values cross it "
                f"[{values}], but a layer chain passes exactly one tensor from each unit to the next. "
                "Put the branching part inside one child module, or build the layers by hand")


def split_at_children(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """``[(child name, unit module)]`` whose composition equals ``module``; ValueError if impossible."""
    model_name = type(module).__name__
    traced = _trace(module)
    unit_of, unit_names = _assign_units(traced.graph, model_name)
    constants = {n for n in traced.graph.nodes if n.op == "get_attr"
                 or (n.op not in ("placeholder", "output") and not n.all_input_nodes)}
    _check_cuts(traced.graph, unit_of, unit_names, model_name, constants)
    split = split_module(traced, module, lambda node: unit_of[node])
    units = []
    for index, name in enumerate(unit_names):
        units.append((name, getattr(split, f"submod_{index}")))
    return units


def _assign_at_points(graph: fx.Graph, points: list[str], model_name: str) -> tuple[dict[fx.Node, int], list[str]]:
    """Unit of every node when a new unit begins at each split point's call, in graph order."""
    unit_of: dict[fx.Node, int] = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise ValueError(f"cannot sequence {model_name}: forward takes {len(placeholders)} inputs "
                         f"({[p.target for p in placeholders]}); a layer chain takes exactly one tensor")
    calls = [str(n.target) for n in graph.nodes if n.op == "call_module"]
    for point in points:
        if calls.count(point) != 1:
            raise ValueError(f"split point {point!r} of {model_name} is called {calls.count(point)} times in its "
                             "forward; a split point must be a submodule called exactly once")
    order = sorted(points, key=calls.index)
    if order != list(points):
        raise ValueError(f"split_points {list(points)} are not in the order the forward calls them: {order}")
    unit = 0
    constants: list[fx.Node] = []
    for node in graph.nodes:
        if node.op == "placeholder":
            unit_of[node] = -1
            continue
        if node.op == "call_module" and unit < len(points) and str(node.target) == points[unit]:
            unit += 1
        if node.op == "output":
            unit_of[node] = len(points) + 1
        elif node.op == "get_attr" or not node.all_input_nodes:
            constants.append(node)
        else:
            unit_of[node] = unit
    for node in reversed(constants):
        unit_of[node] = min((unit_of[u] for u in node.users), default=0)
    first = next((str(n.target) for n in graph.nodes if n.op == "call_module" and unit_of.get(n) == 0), "stem")
    names = [first.replace(".", "_")] + [p.replace(".", "_") for p in points]
    return unit_of, names


def split_at_points(module: nn.Module, points: list[str] | tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    """Cut ``module`` before each named submodule (``["layer2", "layer3.0"]``) into a chain of units.

    The module is traced with ``torch.fx``, keeping the split-point modules
    opaque, and a new unit begins at each split point's call, as
    ``torch.distributed.pipelining``'s split at the beginning of a module does.
    Every other operation (including nested modules, ``getitem`` on tuple
    or dict results, buffers) stays in the unit whose region it is traced
    in, so a value passed as a tuple is unpacked before the cut. The same
    cut check as :func:`split_at_children` applies: exactly one tensor may
    cross each cut. Sub-modules share the original modules and buffers.
    """
    model_name = type(module).__name__
    points = list(points)
    known = {name for name, _ in module.named_modules() if name}
    missing = [p for p in points if p not in known]
    if missing:
        tops = [name for name, _ in module.named_children()]
        raise ValueError(f"split_points {missing} are not submodules of {model_name}; its top-level "
                         f"submodules are {tops} (nested names use dots, such as 'layer2.0')")
    nested = [(a, b) for a in points for b in points if a != b and b.startswith(a + ".")]
    if nested:
        raise ValueError(f"split point {nested[0][1]!r} lies inside split point {nested[0][0]!r}; "
                         "name modules that do not contain each other")
    traced = _trace(module, set(points))
    unit_of, unit_names = _assign_at_points(traced.graph, points, model_name)
    constants = {n for n in traced.graph.nodes if n.op == "get_attr"
                 or (n.op not in ("placeholder", "output") and not n.all_input_nodes)}
    _check_cuts(traced.graph, unit_of, unit_names, model_name, constants)
    split = split_module(traced, module, lambda node: unit_of[node], keep_original_order=True)
    return [(name, getattr(split, f"submod_{index}")) for index, name in enumerate(unit_names)
            if hasattr(split, f"submod_{index}")]
