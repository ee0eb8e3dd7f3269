"""Run under torchrun by tests/train/test_ddp.py: ``torchrun ... tests/train/dist_runs.py ddp|fsdp OUT``.

Trains a user's model (defined in tests/train/test_fit.py) through fit() three times in the same
processes: uninterrupted (OUT/full), stopped after epoch 1 (OUT/split), and resumed from there. The
test compares OUT/full/last.pt with OUT/split/last.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fastops.train import TrainConfig, distributed, fit, run
from tests.train.test_fit import _blobs, _model


def main(mode: str, out: Path) -> None:
    cfg = TrainConfig(
        epochs=2,
        batch_size=8,
        device="cpu",
        progress=False,
        patience=0,
        log_every=3,
        fsdp=mode == "fsdp",
        blocks=("stage1", "stage2"),
        checkpointing=mode == "fsdp",  # recomputation inside FSDP2's sharded blocks
        out_dir=out / "full",
    )
    data = dict(train_data=_blobs(96, 1), val_data=_blobs(30, 2))  # 30: unequal shards over 2 ranks
    fit(_model(), **data, config=cfg)
    fit(_model(), **data, config=cfg, out_dir=out / "split", stop_after_epoch=1)
    torch.manual_seed(123)  # the resumed run restores every RNG from the checkpoint
    fit(_model(seed=5), **data, config=cfg, out_dir=out / "split", resume=out / "split" / "last.pt")
    # The bundled convnet (BatchNorm) with its fastops modules under AMP: bf16 all-gathers, fp32
    # BatchNorm; two micro-batches per step (FSDP2 skips the gradient sync of the first).
    tiny = dict(dataset="synthetic", synthetic_samples=64, image_size=8, width=8, batch_size=8)
    tiny |= dict(epochs=1, amp="bf16", fastops=True, accum_steps=2, out_dir=out / "bundled")
    run(cfg.replace(blocks=(), checkpointing=False, **tiny))  # type: ignore[arg-type]
    distributed.teardown()


def norm_act(out: Path) -> None:
    """A BatchNormAct2d (ReLU) synced over 2 ranks, each with half of one batch: rank 0 saves the
    gathered outputs and the running statistics, for the test to compare with one process."""
    from torch import nn

    from fastops.nn import BatchNormAct2d

    info = distributed.setup(torch.device("cpu"))
    model = distributed.sync_batchnorm(nn.Sequential(BatchNormAct2d(4, act=nn.ReLU())), info.device)
    x = torch.randn(8, 4, 3, 3, generator=torch.Generator().manual_seed(0)) * 2 + 1
    with torch.no_grad():  # no graph holding collectives' state past the teardown
        y = model(x.chunk(info.world_size)[info.rank])
    parts = [torch.empty_like(y) for _ in range(info.world_size)]
    torch.distributed.all_gather(parts, y)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        state = {"type": type(model[0]).__name__, "y": torch.cat(parts), **model.state_dict()}
        torch.save(state, out / "norm_act.pt")
    # Leaving without destroying the group aborted a rank in ~1 of 20 runs ("terminate called
    # without an active exception"): a gloo worker thread released the all_gather's tensors after
    # the interpreter began to finalize and could not take the GIL. teardown() joins those threads.
    distributed.teardown()


if __name__ == "__main__":
    if sys.argv[1] == "norm_act":
        norm_act(Path(sys.argv[2]))
    else:
        main(sys.argv[1], Path(sys.argv[2]))
