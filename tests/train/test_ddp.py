"""DDP: two gloo processes under torchrun train exactly like one process on the doubled batch
(BatchNorm statistics over the global batch, gradients averaged, rank 0 writes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastops.train import checkpoint, run
from tests.train.common import tiny_config

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], timeout: float = 300.0) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",  # two ranks on a 2-core machine
        MASTER_ADDR="127.0.0.1",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
        "-m", "fastops.train", *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc


@pytest.mark.parametrize("use_fastops", [True], ids=["fastops"])  # the stock path shares all DDP code
def test_two_gloo_ranks_equal_one_process_on_the_doubled_batch(tmp_path, use_fastops: bool) -> None:
    # No dropout or augmentation: those draw from per-rank RNG streams by design.
    common = ["--epochs", "1", "--image-size", "8", "--width", "8", "--dropout", "0", "--no-augment"]
    common += ["--no-progress", "--device", "cpu", "--patience", "0", "--log-every", "7"]
    common += [] if use_fastops else ["--baseline"]
    proc = _torchrun([*common, "--batch-size", "16", "--out-dir", str(tmp_path / "ddp")])
    assert proc.stdout.count("epoch   1") == 1  # rank 0 logs, rank 1 does not

    single = run(
        tiny_config(
            tmp_path / "single", fastops=use_fastops, epochs=1, batch_size=32, dropout=0.0, augment=False,
            patience=0, log_every=7,
        )
    )  # fmt: skip
    ddp_summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert ddp_summary["world_size"] == 2 and single["world_size"] == 1
    assert ddp_summary["steps"] == single["steps"]

    a = checkpoint.load(tmp_path / "ddp" / "last.pt")
    b = checkpoint.load(tmp_path / "single" / "last.pt")
    assert len(a["rng"]) == 2  # every rank's RNG state is in the checkpoint
    assert list(a["model"]) == list(b["model"])  # unwrapped keys: no "module." prefix
    for key, value in b["model"].items():
        torch.testing.assert_close(a["model"][key], value, rtol=2e-4, atol=2e-5, msg=key)
    assert abs(a["history"][0]["train_loss"] - b["history"][0]["train_loss"]) < 1e-4
    assert abs(ddp_summary["val_accuracy"] - single["val_accuracy"]) <= 1 / 180 + 1e-9
