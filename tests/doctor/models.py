"""Models and functions for the doctor's tests, at module level so trial processes can unpickle them."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import Tensor, nn


def tiny_convnet() -> nn.Module:
    """fastops.train's bundled convnet (the digits model), narrow and at 8x8."""
    from fastops.train.model import ConvNet

    return ConvNet(1, 10, 8, width=8)


def digits_batch(n: int = 16) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


class Regressor(nn.Module):
    """A user's model: not a classifier, with its own loss."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU())
        self.out = nn.Linear(32, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.body(x)).squeeze(-1)


def mse(outputs: Tensor, batch: tuple[Tensor, ...]) -> Tensor:
    return nn.functional.mse_loss(outputs.float(), batch[1])


def sgd(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01)


class Crashes(nn.Module):
    """Kills its own process on the first forward, as the kernel's OOM killer would."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        os.kill(os.getpid(), signal.SIGKILL)
        return self.fc(x)


class Hangs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        time.sleep(600)
        return self.fc(x)
