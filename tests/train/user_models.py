"""A user's model factory, for ``--model tests.train.user_models:small_mlp`` on the command line."""

from __future__ import annotations

from torch import nn


def small_mlp(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """Two Sequential stages (Linear -> GELU, which fastops fuses) and a head, on flattened images."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Sequential(nn.Linear(in_channels * image_size**2, 32), nn.GELU()),
        nn.Sequential(nn.Linear(32, 32), nn.GELU()),
        nn.Linear(32, num_classes),
    )


NOT_A_FACTORY = 3
