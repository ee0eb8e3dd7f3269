"""Data: scikit-learn's handwritten digits (real data, ships with sklearn, no download), a synthetic
image source for throughput runs, and ImageFolder directories; sharded per rank for DDP/FSDP."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

from fastops.train import extras
from fastops.train.config import ConfigError

# The held-out split is fixed (independent of --seed) so runs with different seeds are comparable.
SPLIT_SEED = 1234
TEST_FRACTION = 0.2
VAL_FRACTION = 0.1


@dataclass
class Data:
    train: DataLoader | SyntheticLoader
    val: DataLoader | SyntheticLoader
    test: DataLoader | SyntheticLoader | None
    in_channels: int
    num_classes: int
    train_samples: int  # across all ranks, per epoch


def digits_tensors(image_size: int) -> dict[str, tuple[Tensor, Tensor]]:
    """The 1797 8x8 digits, split stratified into train/val/test (70/10/20 %), upsampled bilinearly
    to image_size and standardized with the training split's mean and std."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # N,1,8,8 in [0, 1]
    y = torch.tensor(digits.target, dtype=torch.int64)
    idx = list(range(len(y)))
    rest, test = train_test_split(idx, test_size=TEST_FRACTION, stratify=y, random_state=SPLIT_SEED)
    train, val = train_test_split(
        rest,
        test_size=VAL_FRACTION / (1 - TEST_FRACTION),
        stratify=y[rest],
        random_state=SPLIT_SEED,
    )
    if image_size != 8:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return {
        name: (x[ix].contiguous(), y[ix]) for name, ix in (("train", train), ("val", val), ("test", test))
    }


def random_translate(x: Tensor, max_shift: float) -> Tensor:
    """Shift each image by its own random offset of up to max_shift pixels (bilinear, zero fill).

    Runs on x's device with the global RNG, so a resumed run (which restores the RNG state) draws
    the same shifts as an uninterrupted one.
    """
    n, _, h, w = x.shape
    theta = torch.zeros(n, 2, 3, device=x.device, dtype=x.dtype)
    theta[:, 0, 0] = 1
    theta[:, 1, 1] = 1
    shift = (torch.rand(n, 2, device=x.device, dtype=x.dtype) * 2 - 1) * max_shift
    theta[:, 0, 2] = shift[:, 0] * 2 / w
    theta[:, 1, 2] = shift[:, 1] * 2 / h
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


class SyntheticLoader:
    """Random images and labels generated once on the device, served as `steps` batches per epoch.

    For throughput measurement only: no host-to-device copies and no decoding, so the numbers are
    those of the model step.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        image_size: int,
        num_classes: int,
        samples: int,
        device: torch.device,
        seed: int,
    ) -> None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.pool = 4 if samples >= 4 * batch_size else 1
        self.x = torch.randn(self.pool * batch_size, 3, image_size, image_size, generator=g).to(device)
        self.y = torch.randint(0, num_classes, (self.pool * batch_size,), generator=g).to(device)
        self.batch_size = batch_size
        self.steps = max(1, samples // batch_size)

    def set_epoch(self, epoch: int) -> None:  # DistributedSampler's interface; nothing to reshuffle
        pass

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        b = self.batch_size
        for i in range(self.steps):
            j = i % self.pool
            yield self.x[j * b : (j + 1) * b], self.y[j * b : (j + 1) * b]


def build_data(cfg, *, rank: int, world_size: int, device: torch.device) -> Data:
    """Loaders for cfg.dataset, sharded for this rank (see train_loader and eval_loader)."""
    if cfg.dataset == "synthetic":
        make = lambda samples, seed: SyntheticLoader(  # noqa: E731
            batch_size=cfg.batch_size,
            image_size=cfg.image_size,
            num_classes=cfg.num_classes,
            samples=samples,
            device=device,
            seed=seed,
        )
        synth_train = make(cfg.synthetic_samples, cfg.seed * 1000 + rank)
        synth_val = make(max(cfg.batch_size, cfg.synthetic_samples // 8), cfg.seed * 1000 + rank + 500)
        samples = len(synth_train) * cfg.batch_size * world_size
        return Data(synth_train, synth_val, None, 3, cfg.num_classes, samples)

    if cfg.dataset != "digits":
        return image_folder_data(cfg, rank=rank, world_size=world_size, device=device)
    extras.require("sklearn", "--data digits", "scikit-learn")
    splits = digits_tensors(cfg.image_size)
    train_set = TensorDataset(*splits["train"])
    train = train_loader(train_set, cfg, rank=rank, world_size=world_size, device=device)
    val, test = (
        eval_loader(TensorDataset(*splits[name]), cfg, rank=rank, world_size=world_size, device=device)
        for name in ("val", "test")
    )
    per_rank = math.floor(len(train_set) / world_size)
    steps = per_rank // cfg.batch_size
    return Data(train, val, test, 1, 10, steps * cfg.batch_size * world_size)


# The per-channel statistics torchvision's ImageNet weights were trained with: the usual choice.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def image_folder_data(cfg, *, rank: int, world_size: int, device: torch.device) -> Data:
    """A directory in ImageFolder layout: ``train/CLASS/*.jpg``, ``val/CLASS/*``, optionally ``test/``.

    The standard transforms: for training, a random resized crop to image_size and a horizontal
    flip (no augmentation: as for evaluation); for evaluation, a resize to 8/7 of image_size and
    a centre crop; then ImageNet's normalization.
    """
    extras.require(
        "torchvision", f"--data {cfg.dataset} (an ImageFolder directory)", "torchvision", in_extra=False
    )
    from torchvision import datasets
    from torchvision import transforms as T

    size = cfg.image_size
    normalize = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    eval_tf = T.Compose([T.Resize(size * 8 // 7), T.CenterCrop(size), *normalize])
    train_tf = (
        T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *normalize])
        if cfg.augment
        else eval_tf
    )
    root = Path(cfg.dataset)
    train_set = datasets.ImageFolder(str(root / "train"), train_tf)
    splits = {"val": datasets.ImageFolder(str(root / "val"), eval_tf)}
    if (root / "test").is_dir():
        splits["test"] = datasets.ImageFolder(str(root / "test"), eval_tf)
    for name, split in splits.items():
        if split.classes != train_set.classes:
            raise ConfigError(
                f"fastops.train: --data {cfg.dataset}: {name}/ has classes {split.classes}, "
                f"train/ has {train_set.classes}; they must be the same"
            )
    where = dict(cfg=cfg, rank=rank, world_size=world_size, device=device)
    test = eval_loader(splits["test"], **where) if "test" in splits else None
    steps = len(train_set) // world_size // cfg.batch_size
    return Data(
        train_loader(train_set, **where),
        eval_loader(splits["val"], **where),
        test,
        3,
        len(train_set.classes),
        steps * cfg.batch_size * world_size,
    )


def _loader_options(cfg, device: torch.device) -> dict[str, Any]:
    # Pinned host memory makes the host-to-GPU copy asynchronous; workers that outlive an epoch
    # save their start-up at every epoch.
    return dict(
        num_workers=cfg.num_workers, pin_memory=device.type == "cuda", persistent_workers=cfg.num_workers > 0
    )


def train_loader(dataset: Dataset, cfg, *, rank: int, world_size: int, device: torch.device) -> DataLoader:
    """The training DataLoader of a map-style ``dataset``, sharded for this rank.

    A DistributedSampler also with one process: it shuffles from seed + epoch, so the order of every
    epoch is a pure function of the seed, which makes --resume exact. drop_last, so every step sees
    full batches on every rank.
    """
    sampler: DistributedSampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    return DataLoader(
        dataset, batch_size=cfg.batch_size, sampler=sampler, drop_last=True, **_loader_options(cfg, device)
    )


def eval_loader(dataset: Dataset, cfg, *, rank: int, world_size: int, device: torch.device) -> DataLoader:
    """Rank r evaluates samples r, r + world, ... with no padding; the metrics are summed over
    ranks, so each held-out sample counts exactly once."""
    shard = Subset(dataset, range(rank, len(dataset), world_size))  # type: ignore[arg-type]
    return DataLoader(
        shard, batch_size=max(256, cfg.batch_size), shuffle=False, **_loader_options(cfg, device)
    )
