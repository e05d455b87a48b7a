"""A stage's backward in two passes: the input gradient now (I), the weight gradients later (W).

Problem. Zero-bubble schedules send a stage's input gradient upstream as
soon as it exists and compute the weight gradients later, in a bubble. The
plain way, ``autograd.grad`` to the input and later ``autograd.grad`` to the
parameters from the same graph, runs the chain of activation gradients
twice: W would redo most of I.

Approach (the technique torch's pipelining uses, written for our stages).
Before I, walk the stage's autograd graph from its output: the nodes on a
path from the stage input up to the output carry the activation gradients
(the *input closure*). For every parameter, the nodes where its own branch
joins that closure are where its gradient starts; a pre-hook on each of
them records the gradient flowing into it while I runs. I computes only
what the input gradient needs (autograd skips the weight branches). W then
starts autograd at those recorded gradients and ends at the parameters, so
it runs only the weight branches. Parameters with no path from the input
(the first stage, whose input needs no gradient, or layers before it) get
their whole gradient in W, from the output.

Vectors (biases, normalisation scales and shifts) get their gradients in
I: the node that computes the input gradient computes theirs in the same
call (a batch norm's backward is one kernel for all three), so deferring
them would run that node twice for nothing; W keeps the matrices, whose
gradients are the products worth moving into the bubbles.

:class:`SplitBackward` holds what one micro-batch needs between its I and
its W; the graph stays alive until W, as the memory walk assumes.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any, Sequence

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

__all__ = ["SplitBackward"]

# One implementation for the runtime's stages and for the profiler, which times I and W as the stages run them.


def _node(tensor: torch.Tensor) -> Node | None:
    """A tensor's grad_fn, or its gradient accumulator when it is a leaf that requires grad."""
    if tensor.grad_fn is not None:
        return tensor.grad_fn
    if tensor.requires_grad:
        return tensor.view_as(tensor).grad_fn.next_functions[0][0]
    return None


def _users(root: Node) -> dict[Node, list[Node]]:
    """For every node reachable from ``root`` (towards the leaves), the nodes that feed their gradient into it."""
    users: dict[Node, list[Node]] = defaultdict(list)
    queue, seen = deque([root]), {root}
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            users[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return users


def _upward(starts: Sequence[Node], users: dict[Node, list[Node]], stop: set[Node]) -> tuple[set[Node], set[Node]]:
    """The nodes reachable from ``starts`` towards the output, not passing ``stop``; and the ``stop`` nodes met."""
    reached, met = set(starts), set()
    queue = deque(starts)
    while queue:
        for user in users.get(queue.popleft(), ()):
            if user in stop:
                met.add(user)
            elif user not in reached:
                reached.add(user)
                queue.append(user)
    return reached, met


class SplitBackward:
    """The two halves of one micro-batch's backward through a stage.

    ``output`` is what the stage's forward returned (the scaled loss on the
    last stage), ``input_edge`` the gradient edge of its input, taken before
    the forward (``get_gradient_edge``; None when the input needs no
    gradient), ``params`` the parameters to differentiate.
    """

    def __init__(self, output: torch.Tensor, input_edge: GradientEdge | None,
                 params: Sequence[torch.nn.Parameter]) -> None:
        self.output = output
        trainable = [p for p in params if p.requires_grad]
        # with an input gradient to compute, vectors come along with it (module docstring); the rest wait for W
        self.eager = [p for p in trainable if p.dim() <= 1] if input_edge is not None else []
        self.params = [p for p in trainable if not any(p is e for e in self.eager)]
        self.input_edge = input_edge
        self.input_node = input_edge.node if input_edge is not None else None
        self.grad_output: torch.Tensor | None = None
        self._joins: list[tuple[Node, list[torch.nn.Parameter]]] = []
        self._recorded: dict[Node, tuple] = {}
        self.nodes: list[Node] = []  # the graph's nodes, as I walked them (empty when I ran nothing)

    def backward_input(self, grad_output: torch.Tensor | None) -> torch.Tensor | None:
        """I: the gradient of the stage input (None when it needs none); the weight branches are left for W."""
        self.grad_output = grad_output
        if self.input_node is None:
            return None
        root = _node(self.output)
        users = _users(root)
        self.nodes = [root, *users]
        closure, _ = _upward([self.input_node], users, set())
        hooks = []
        for join, params in self._join_points(users, closure):
            self._joins.append((join, params))
            hooks.append(join.register_prehook(self._recorder(join)))
        try:
            grad_input, *vectors = torch.autograd.grad(
                self.output, [self.input_edge, *(_param_edge(p) for p in self.eager)],
                grad_outputs=self.output_grad(), retain_graph=True, allow_unused=True)
            self._accumulate(self.eager, vectors)
            return grad_input
        finally:
            for hook in hooks:
                hook.remove()

    def backward_weight(self) -> None:
        """W: every parameter's gradient, added to ``.grad``, from what I recorded (or from the output)."""
        if self.input_node is None:  # nothing ran in I: W is the whole backward, accumulated as autograd does
            self.output.backward(self.output_grad())
            self.output = None
            return
        done: set[int] = set()
        for join, params in self._joins:
            grads = self._recorded.get(join)
            edges = [(GradientEdge(join, i), g) for i, g in enumerate(grads or ()) if g is not None]
            if not edges:
                continue
            self._accumulate(params, torch.autograd.grad([e for e, _ in edges], [_param_edge(p) for p in params],
                                                         grad_outputs=[g for _, g in edges], retain_graph=True,
                                                         allow_unused=True))
            done.update(id(p) for p in params)
        rest = [p for p in self.params if id(p) not in done]
        if rest:
            self._accumulate(rest, torch.autograd.grad(self.output, rest, grad_outputs=self.output_grad(),
                                                       allow_unused=True))
        self._joins.clear()
        self._recorded.clear()
        self.nodes = []
        self.output = None

    # -- helpers ----------------------------------------------------------------------------------------------------
    def output_grad(self) -> Any:
        """The gradient W starts from at the output (None for a scalar loss)."""
        return None if self.grad_output is None else self.grad_output.to(self.output.dtype)

    def _join_points(self, users: dict[Node, list[Node]], closure: set[Node]) -> list[tuple[Node, list]]:
        """Per node of the input closure where some parameters' branches join it, those parameters. A parameter
        whose branch meets the closure at several nodes is left to the whole-output pass (exactness first)."""
        by_join: dict[Node, list] = defaultdict(list)
        for param in self.params:
            node = _node(param)
            if node is None or node not in users:
                continue
            _, met = _upward([node], users, closure)
            if len(met) == 1:
                by_join[next(iter(met))].append(param)
        return list(by_join.items())

    def _recorder(self, join: Node):
        def record(grad_outputs: tuple) -> None:
            self._recorded[join] = tuple(g.detach() if g is not None else None for g in grad_outputs)
        return record

    @staticmethod
    def _accumulate(params: Sequence[torch.nn.Parameter], grads: Sequence[torch.Tensor | None]) -> None:
        with torch.no_grad():
            for param, grad in zip(params, grads):
                if grad is None:
                    continue
                if param.grad is None:
                    param.grad = grad.detach()
                else:
                    param.grad.add_(grad)


def _param_edge(param: torch.nn.Parameter) -> GradientEdge:
    return get_gradient_edge(param)
