"""Apply a per-layer parallel plan to the unmodified layers of one pipeline stage.

Problem. A :class:`~workbench.core.plan.ParallelPlan` may give every layer its
own data-parallel kind (replicate, zero2, fsdp), its own 1D tensor-parallel
degree and its own recomputation. Inside a stage of ``n`` ranks, a layer with
tensor-parallel degree ``t`` splits its weights over groups of ``t`` ranks
and its batch over the ``n / t`` groups, so two neighbouring layers may
disagree on which rows of the batch a rank holds.

Approach, torchtitan-style, from outside the model and only with torch's own
building blocks:

* one :class:`~torch.distributed.device_mesh.DeviceMesh` per layer layout
  (degree, consecutive or strided ranks), with named dims ``pp`` x ``dp`` x
  ``tp`` built from the plan's topology; a layer takes its stage's
  ``["dp", "tp"]`` submesh;
* 1D tensor parallelism: DTensor ``parallelize_module`` with
  ``ColwiseParallel`` / ``RowwiseParallel`` on the linears of HF GPT-2 blocks
  (``Conv1D``, weight [in, out]), HF BERT layers and plain ``nn.Linear``
  chains; GPT-2's fused q|k|v weight is re-laid out head-group-major so
  that a column shard holds complete heads of q, k and v;
* recomputation: ``torch.utils.checkpoint`` (non-reentrant) around exactly
  the marked layers, inside the data-parallel wrapper;
* data parallelism: FSDP2 ``fully_shard`` (``reshard_after_forward`` True for
  ``fsdp``, False for ``zero2``) or FSDP2's ``replicate`` (DDP semantics), on
  the layer's ``dp`` dim, gradients summed (see below);
* between layers of different layouts, :class:`Relayout` moves activations
  through the logical *stage batch*: every rank of the stage holds the whole
  stage micro-batch where it enters the stage (and where it leaves it for
  the next stage), a layer's data-parallel group ``d`` takes rows
  ``[d N / D, (d + 1) N / D)``.

The last stage is not gathered: each of its ranks computes the loss only of
the rows its last layer's data group holds, weighted so that the groups'
parts add up to the loss of the whole stage micro-batch (the ranks of one
tensor-parallel group compute the same part; one of them reports it). Each
rank's gradient is thus an exact *part* of the true gradient: the
data-parallel reduction sums (divide factor 1) instead of averaging.

What was applied is read back from the wrapped modules
(:func:`realized_options`) and compared with the plan; a mismatch is an
error, never a fallback.

Memory count. :class:`SavedActivations` counts the bytes of the tensors
autograd keeps for backward while it is active (live and peak, each storage
once, parameters excluded; a recomputed layer keeps its input), and
:func:`local_bytes` / :func:`held_unsharded_bytes` count what a rank holds
of parameters, gradients, optimizer state and all-gathered FSDP
parameters, so a rank's memory can be counted on any device.

The package holds one module per part: :mod:`.meshes` (layouts and device
meshes), :mod:`.relayout` (activations between layouts),
:mod:`.tensor_rules` (1D tensor-parallel plans of known layers),
:mod:`.recompute`, :mod:`.parallelize` (one layer applied and read back) and
:mod:`.memory` (the memory count).
"""

from .memory import SavedActivations, held_unsharded_bytes, local_bytes
from .meshes import Layout, StageMeshes, layout_of
from .parallelize import ParallelLayer, check_realized, dense_parameters, parallelize_layer, realized_options
from .recompute import Recomputed
from .relayout import Relayout
from .tensor_rules import tensor_parallel_limit, tensor_parallel_limits, tensor_parallel_rules

__all__ = ["Layout", "layout_of", "StageMeshes", "Relayout", "Recomputed", "ParallelLayer", "parallelize_layer",
           "realized_options", "check_realized", "dense_parameters", "tensor_parallel_rules", "SavedActivations",
           "local_bytes", "held_unsharded_bytes", "tensor_parallel_limit", "tensor_parallel_limits"]
