"""DDP: two gloo processes under torchrun train exactly like one process on the doubled batch
(BatchNorm statistics over the global batch, gradients averaged, rank 0 writes)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import fastops
from fastops.train import checkpoint, distributed, run
from tests.train.common import tiny_config

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",  # two ranks on a 2-core machine
        MASTER_ADDR="127.0.0.1",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    )
    return env


def _check(proc: subprocess.CompletedProcess | subprocess.Popen, stdout: str, stderr: str) -> None:
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{stdout[-3000:]}\n{stderr[-5000:]}"


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), children before grandchildren."""
    parent_of: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid ...
            parent_of[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for child, parent in parent_of.items() if parent in frontier]
        found += frontier
    return found


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _torchrun(args: list[str], timeout: float = 300.0, *, module: bool = True) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
        *(["-m", "fastops.train"] if module else []), *args,
    ]  # fmt: skip
    env = {**_env(), "PYTHONFAULTHANDLER": "1"}  # SIGABRT prints every thread's stack first
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # A hang: show where each process (torchrun's agent and every rank) waits, not only that it did.
        # The ranks run in sessions of their own, so they are signalled one by one: a rank left alive
        # keeps the pipes open and communicate() would wait for it forever.
        processes = [proc.pid, *_descendants(proc.pid)]
        _signal_all(processes, signal.SIGABRT)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            _signal_all(processes, signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(
            f"torchrun ran past {timeout:.0f} s; the processes' stacks:\n{stdout[-3000:]}\n{stderr[-20000:]}"
        )
    _check(proc, stdout, stderr)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux /proc")
def test_a_hung_torchrun_is_killed_down_to_its_ranks() -> None:
    # A grandchild in a session of its own, as torchrun's ranks are: killpg on the parent misses it.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.run(['sleep', '60'], start_new_session=True)",
        ],
        start_new_session=True,
    )
    try:
        for _ in range(100):
            below = _descendants(proc.pid)
            if below:
                break
            time.sleep(0.05)
        assert len(below) == 1 and Path(f"/proc/{below[0]}/cmdline").read_bytes().startswith(b"sleep")
        _signal_all([proc.pid, *below], signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        for _ in range(100):  # the orphaned grandchild is reaped by init once killed
            try:  # gone, or a zombie (state Z) until init reaps it
                if Path(f"/proc/{below[0]}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            except FileNotFoundError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the grandchild survived")
    finally:
        proc.kill()


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


def _norm_act_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(fastops.nn.BatchNormAct2d(4, act=nn.ReLU()))
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        model[0].bias.uniform_(-0.5, 0.5)
        model[0].running_mean.uniform_(-1, 1)
    return model


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_sync_batchnorm_keeps_the_activation_of_batch_norm_act(device: str) -> None:
    """torch's convert_sync_batchnorm made a BatchNormAct2d a plain SyncBatchNorm whose act was never
    called (a ReLU model gave negative outputs), and the gloo path left it unsynced. The conversion
    is tested on the CPU for both branches (NCCL needs one GPU per rank); outputs in eval mode."""
    model = _norm_act_model().eval()
    x = torch.randn(2, 4, 5, 5) * 3
    want = model(x)
    converted = distributed.sync_batchnorm(copy.deepcopy(model), torch.device(device))
    norm = converted[0]
    expected = distributed.SyncBatchNormAct2d if device == "cuda" else distributed.GlooSyncBatchNormAct2d
    assert type(norm) is expected
    assert isinstance(norm.act, nn.ReLU) and isinstance(norm.drop, nn.Identity)
    assert list(converted.state_dict()) == list(model.state_dict())
    got = converted(x)
    assert got.min() == 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_batch_norm_act_is_synced_over_two_gloo_ranks(tmp_path) -> None:
    """Two ranks with half a batch each give the outputs and running statistics of one process on
    the whole batch, ReLU included."""
    _torchrun([str(REPO / "tests" / "train" / "dist_runs.py"), "norm_act", str(tmp_path)], module=False)
    got = torch.load(tmp_path / "norm_act.pt")
    assert got["type"] == "GlooSyncBatchNormAct2d"
    model = nn.Sequential(nn.BatchNorm2d(4), nn.ReLU())
    want = model(torch.randn(8, 4, 3, 3, generator=torch.Generator().manual_seed(0)) * 2 + 1)
    assert got["y"].min() == 0
    torch.testing.assert_close(got["y"], want, rtol=1e-5, atol=1e-5)
    for key, value in model[0].state_dict().items():
        torch.testing.assert_close(got[f"0.{key}"], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_users_model_under_ddp_and_fsdp2_resumes_exactly(tmp_path, mode: str) -> None:
    """fit() with a Dataset under torchrun: 2 gloo ranks, uninterrupted vs stopped and resumed in the
    same processes. FSDP2 checkpoints are sharded (torch.distributed.checkpoint) and load into a
    single process for evaluation."""
    from tests.train.test_fit import _model

    _torchrun([str(REPO / "tests" / "train" / "dist_runs.py"), mode, str(tmp_path)], module=False)
    weights = {}
    for name in ("full", "split"):
        ckpt = checkpoint.load(tmp_path / name / "last.pt", resumable=True)
        assert ckpt["epoch"] == 2 and len(ckpt["rng"]) == 2
        assert ("sharded" in ckpt) == (mode == "fsdp")
        model = _model(seed=9)
        checkpoint.load_weights(tmp_path / name / "last.pt", model)  # one process, no process group
        weights[name] = model.state_dict()
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["epochs"] == 2
    for key, value in weights["full"].items():
        assert torch.equal(weights["split"][key], value), key
    bundled = json.loads((tmp_path / "bundled" / "summary.json").read_text())
    assert bundled["amp"] == "bf16" and bundled["val_accuracy"] is not None
    if mode == "fsdp":  # superseded shard directories are removed
        assert sorted(p.name for p in (tmp_path / "split").glob("last.dcp.*")) == ["last.dcp.12"]


def test_two_nodes_of_one_process_each_over_c10d_rendezvous(tmp_path) -> None:
    """Multi-node as documented: torchrun --nnodes=2 --rdzv-backend=c10d, one process per "node",
    both on 127.0.0.1."""
    endpoint = f"127.0.0.1:{_free_port()}"
    args = ["--epochs", "1", "--image-size", "8", "--width", "8", "--no-progress", "--device", "cpu"]
    nodes = []
    for node_rank in (0, 1):
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=2", "--nproc_per_node=1", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", "--rdzv-id=fastops-test",
            "-m", "fastops.train", *args, "--out-dir", str(tmp_path),
        ]  # fmt: skip
        nodes.append(
            subprocess.Popen(
                cmd, env=_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for node in nodes:
        try:
            out, err = node.communicate(timeout=240)
        finally:
            if node.poll() is None:
                node.kill()
        _check(node, out, err)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 1
