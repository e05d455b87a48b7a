"""2D tensor parallelism (SUMMA / Optimus) for transformers GPT-2 and BERT.

Ranks form a q x q grid per data-parallel replica (world = dp x q²):
activations are split by batch over grid rows and by hidden size over grid
columns, weights into [in/q, out/q] blocks. ``comm`` holds the grid and its
counted collectives, ``ops`` the SUMMA products as autograd functions,
``layers`` the 2D building blocks, ``models`` GPT-2 / BERT assembled from
them, ``sharding`` the conversion from (and back to) an unmodified dense model,
``train`` the training loop the entry module runs.
"""

from .comm import CommCounter, Grid2D
from .layers import Attention2D, Embedding2D, Head2D, LayerNorm2D, Linear2D, MLP2D, causal_lm_loss_2d, cross_entropy_2d
from .sharding import ShardRules2D, check_grid_size, parallelize_2d
from .train import TensorParallelConfig, run_tensor2d, run_tensor_parallel

__all__ = [
    "CommCounter", "Grid2D", "Attention2D", "Embedding2D", "Head2D", "LayerNorm2D", "Linear2D", "MLP2D",
    "causal_lm_loss_2d", "cross_entropy_2d", "ShardRules2D", "check_grid_size", "parallelize_2d",
    "TensorParallelConfig", "run_tensor2d", "run_tensor_parallel",
]
