"""Small configurations that train in a second or two on a CPU core, and a kill at a chosen point."""

from __future__ import annotations

from pathlib import Path

from fastops.train import TrainConfig, Trainer


def tiny_config(out_dir: Path, **overrides: object) -> TrainConfig:
    base = TrainConfig(
        image_size=8, width=8, epochs=2, batch_size=64, device="cpu", progress=False, out_dir=out_dir
    )
    return base.replace(**overrides)


def killed_before(name: str, epoch: int):
    """A Trainer.save that "dies" (KeyboardInterrupt) instead of writing ``name`` at ``epoch``: a
    kill at that point, for monkeypatch.setattr(Trainer, "save", ...)."""
    save = Trainer.save

    def save_or_die(self, path, state):
        if path.name == name and self.epoch == epoch:
            raise KeyboardInterrupt(f"killed before {name} of epoch {epoch}")
        save(self, path, state)

    return save_or_die
