"""Models of the CLI: the bundled convnet of depthwise-separable residual blocks with squeeze-excitation,
and :func:`load_model`, which builds whatever ``--model`` names (timm, torchvision, your factory).

It is built from stock modules (nn.Conv2d with groups=C, nn.GELU, nn.Linear + nn.GELU inside
nn.Sequential, a plain squeeze-excitation block, nn.BatchNorm2d); :func:`build_model` with ``fastops=True`` then calls
:func:`fastops.swap_modules`, so the fastops and the stock model start from the same weights for the
same seed and their state_dicts are interchangeable.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fastops.swap import SwapReport, swap_modules
from fastops.train import extras
from fastops.train.config import ConfigError, TrainConfig


class SqueezeExcite(nn.Module):
    """Channel gates from the globally pooled features: ``x * sigmoid(W2 gelu(W1 mean_hw(x)))``.

    The plain SE block of docs/squeeze_excite.md (children fc1, act, fc2, gate), which
    swap_modules replaces by fastops.nn.SqueezeExcite (fused pool/scale passes and a one-pass backward).
    """

    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        hidden = max(8, channels // reduction)
        self.fc1 = nn.Linear(channels, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, channels)
        self.gate = nn.Sigmoid()

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(x.mean((2, 3))))))[:, :, None, None]


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


def _call_factory(factory: Callable[..., Any], spec: str, **available: Any) -> nn.Module:
    """``factory`` called with the keywords it takes among ``available``."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: call it plainly
        params = {}  # type: ignore[assignment]
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in available.items() if takes_all or k in params}
    model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"fastops.train: --model {spec}: the factory returned {type(model).__name__}, not an nn.Module"
        )
    return model


def load_model(
    spec: str,
    *,
    in_channels: int,
    num_classes: int,
    image_size: int,
    width: int = 32,
    dropout: float = 0.1,
    pretrained: bool = False,
) -> nn.Module:
    """The model ``--model`` names, with stock modules (the Trainer swaps them when asked).

    * ``convnet``: the bundled ConvNet.
    * ``timm:NAME``: ``timm.create_model(NAME, num_classes=..., in_chans=...)``; with ``pretrained``
      only weights already in the local Hugging Face cache (HF_HUB_OFFLINE), never a download.
    * ``torchvision:NAME``: ``torchvision.models.get_model(NAME, num_classes=...)`` (3-channel
      images); with ``pretrained`` the default weights, only if already in torch.hub's cache.
    * ``package.module:factory``: your code, imported (the CLI puts the current directory on
      sys.path, as ``python -m`` does) and called with the keywords it takes among num_classes, in_channels and
      image_size.
    """
    if spec == "convnet":
        return ConvNet(in_channels, num_classes, image_size, width=width, dropout=dropout)
    kind, _, name = spec.partition(":")
    if kind == "timm":
        extras.require("timm", f"--model {spec}", "timm", in_extra=False)
        import timm

        if pretrained:
            os.environ["HF_HUB_OFFLINE"] = "1"  # local weights only: never download during a run
        try:
            return timm.create_model(
                name, pretrained=pretrained, num_classes=num_classes, in_chans=in_channels
            )
        except RuntimeError as e:  # an unknown name
            raise ConfigError(f"fastops.train: --model {spec}: {e}") from None
        except OSError as e:  # offline and not in the cache
            raise ConfigError(
                f"fastops.train: --model {spec} --pretrained: the weights are not in the local cache ({e})"
            ) from None
    if kind == "torchvision":
        extras.require("torchvision", f"--model {spec}", "torchvision", in_extra=False)
        import torchvision

        if in_channels != 3:
            raise ConfigError(
                f"fastops.train: --model {spec} takes 3-channel images; the data has {in_channels} "
                "channel(s) (use --data synthetic or an ImageFolder directory)"
            )
        try:
            weights = torchvision.models.get_model_weights(name).DEFAULT if pretrained else None
        except ValueError as e:
            raise ConfigError(f"fastops.train: --model {spec}: {e}") from None
        if weights is not None:
            cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
            if not cached.is_file():
                raise ConfigError(
                    f"fastops.train: --model {spec} --pretrained: the weights are not at {cached}; "
                    "download them first (fastops.train never downloads during a run)"
                )
            # The pretrained head has the weights' classes; a new head for this data replaces it.
            model = torchvision.models.get_model(name, weights=weights)
            return _replace_head(model, num_classes, spec)
        return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    module_name, attr = kind, name
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"fastops.train: --model {spec}: cannot import {module_name!r} ({e})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"fastops.train: --model {spec}: {module_name!r} has no callable {attr!r}")
    return _call_factory(
        factory, spec, num_classes=num_classes, in_channels=in_channels, image_size=image_size
    )


def model_from_config(cfg: TrainConfig, *, in_channels: int, num_classes: int) -> nn.Module:
    """The model ``cfg.model`` names, for data of ``in_channels`` and ``num_classes``, with its
    initial weights drawn from ``cfg.seed`` (the same on every rank, and in every run of the seed)."""
    torch.manual_seed(cfg.seed)
    return load_model(
        cfg.model,
        in_channels=in_channels,
        num_classes=num_classes,
        image_size=cfg.image_size,
        width=cfg.width,
        dropout=cfg.dropout,
        pretrained=cfg.pretrained,
    )


def _replace_head(model: nn.Module, num_classes: int, spec: str) -> nn.Module:
    for attr in ("fc", "classifier", "head", "heads"):
        head = getattr(model, attr, None)
        if isinstance(head, nn.Sequential):
            head = head[-1]
            if isinstance(head, nn.Linear):
                getattr(model, attr)[-1] = nn.Linear(head.in_features, num_classes)
                return model
        elif isinstance(head, nn.Linear):
            setattr(model, attr, nn.Linear(head.in_features, num_classes))
            return model
    raise ConfigError(
        f"fastops.train: --model {spec} --pretrained: no Linear classifier head found to replace"
    )
