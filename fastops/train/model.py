"""The main job's model: a small convnet of depthwise-separable residual blocks with squeeze-excitation.

It is built from stock modules (nn.Conv2d with groups=C, nn.GELU, nn.Linear + nn.GELU inside
nn.Sequential, nn.BatchNorm2d); :func:`build_model` with ``fastops=True`` then calls
:func:`fastops.swap_modules`, so the fastops and the stock model start from the same weights for the
same seed and their state_dicts are interchangeable.
"""

from __future__ import annotations

from torch import Tensor, nn

from fastops.swap import SwapReport, swap_modules


class SqueezeExcite(nn.Module):
    """Channel gates from the globally pooled features: ``x * sigmoid(W2 gelu(W1 mean_hw(x)))``."""

    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        hidden = max(8, channels // reduction)
        # Linear -> GELU inside a Sequential: swap_modules fuses the pair into fastops.nn.LinearGELU.
        self.fc = nn.Sequential(
            nn.Linear(channels, hidden), nn.GELU(), nn.Linear(hidden, channels), nn.Sigmoid()
        )

    def forward(self, x: Tensor) -> Tensor:
        return x * self.fc(x.mean((2, 3)))[:, :, None, None]


class SeparableBlock(nn.Module):
    """depthwise 3x3 -> BN -> GELU -> pointwise 1x1 -> BN -> GELU -> SE, plus a residual when shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False)
        self.bn1 = nn.BatchNorm2d(cin)
        self.act1 = nn.GELU()
        self.pw = nn.Conv2d(cin, cout, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.act2 = nn.GELU()
        self.se = SqueezeExcite(cout)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        y = self.act1(self.bn1(self.dw(x)))
        y = self.se(self.act2(self.bn2(self.pw(y))))
        return x + y if self.residual else y


class ConvNet(nn.Module):
    """Stem conv, then stages of SeparableBlocks that halve the resolution down to <= 8x8 (the last
    stage ends at <= 4x4), then global pooling and an MLP head.

    Its SeparableBlocks are the units of activation checkpointing and FSDP2 sharding
    (``Trainer(..., blocks=[SeparableBlock])``).
    """

    def __init__(
        self, in_channels: int, num_classes: int, image_size: int, width: int = 32, dropout: float = 0.1
    ) -> None:
        super().__init__()
        stem_stride = 2 if image_size > 64 else 1
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, stride=stem_stride, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.GELU(),
        )
        blocks: list[nn.Module] = [SeparableBlock(width, width, 1)]
        size, channels = -(-image_size // stem_stride), width
        while size > 4:
            out = min(channels * 2, width * 16)
            blocks += [SeparableBlock(channels, out, 2), SeparableBlock(out, out, 1)]
            size, channels = -(-size // 2), out
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.Linear(channels, 2 * channels),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(2 * channels, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        x = self.blocks(x)
        return self.head(x.mean((2, 3)))


def build_model(
    *,
    in_channels: int,
    num_classes: int,
    image_size: int,
    width: int = 32,
    dropout: float = 0.1,
    fastops: bool = True,
) -> tuple[ConvNet, SwapReport | None]:
    """The ConvNet, and with ``fastops=True`` its stock modules swapped for fastops ones.

    Returns ``(model, swap_report)``; the report is None for the stock model.
    """
    model = ConvNet(in_channels, num_classes, image_size, width=width, dropout=dropout)
    if not fastops:
        return model, None
    return model, swap_modules(model)
