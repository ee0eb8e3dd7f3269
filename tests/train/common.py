"""Small configurations that train in a second or two on a CPU core."""

from __future__ import annotations

from pathlib import Path

from fastops.train import TrainConfig


def tiny_config(out_dir: Path, **overrides: object) -> TrainConfig:
    base = TrainConfig(
        image_size=8, width=8, epochs=2, batch_size=64, device="cpu", progress=False, out_dir=out_dir
    )
    return base.replace(**overrides)
