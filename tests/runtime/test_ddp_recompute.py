"""DDP with recomputation replays each replica's forward in backward and gives the same gradients."""

import torch
from torch import nn

from workbench.runtime.strategies.ddp import _Recomputed


def test_recomputed_replica_runs_forward_twice_and_matches_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    calls = []
    model[0].register_forward_hook(lambda *_: calls.append(1))
    grads = []
    for wrapped in (model, _Recomputed(model)):
        model.zero_grad()
        calls.clear()
        torch.manual_seed(1)  # the same dropout mask in both runs
        wrapped(x).square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        assert len(calls) == (1 if wrapped is model else 2)  # the replay in backward
    for plain, replayed in zip(*grads):
        torch.testing.assert_close(plain, replayed, rtol=0, atol=0)
