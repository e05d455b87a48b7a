"""The model zoo as ordered, partitionable layer sequences (torch).

``build_model(name)`` builds a real model (torchvision, transformers or a toy
net) from its config with seeded random weights and returns it as a
:class:`LayerSequence`; ``sample_batch`` makes a matching synthetic batch;
:mod:`workbench.models.data` holds two real small tasks (digits, bytes LM).
"""

from .data import bytes_lm_batches, digits_batches, sample_batch
from .sequence import InputSpec, LayerSequence, token_cross_entropy
from .zoo import ZOO, build_model, build_reference, describe_models, list_models

__all__ = [
    "LayerSequence", "InputSpec", "token_cross_entropy", "build_model", "build_reference", "list_models",
    "describe_models", "ZOO", "sample_batch", "digits_batches", "bytes_lm_batches",
]
