"""PNG plots: training curves of one run, and the fastops-vs-stock comparison bar chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def plot_curves(history: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Loss (train, val) and accuracy (train, val) per epoch, side by side."""
    plt = _pyplot()
    epochs = [h["epoch"] for h in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    # A run without validation data has no val_* values: its validation curves are left out.
    for key, label in (("train_loss", "train"), ("val_loss", "validation")):
        if all(h.get(key) is not None for h in history):
            ax_loss.plot(epochs, [h[key] for h in history], marker=".", label=label)
    for key, label in (("train_accuracy", "train"), ("val_accuracy", "validation")):
        if all(h.get(key) is not None for h in history):
            ax_acc.plot(epochs, [100 * h[key] for h in history], marker=".", label=label)
    ax_loss.set(xlabel="epoch", ylabel="loss", yscale="log", title="loss")
    ax_acc.set(xlabel="epoch", ylabel="metric (%)", title="accuracy, or metric_fn")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_compare(results: dict[str, dict[str, Any]], path: Path) -> None:
    """One bar chart per metric (accuracy, samples/s, peak memory), one bar per run."""
    plt = _pyplot()
    metrics = [
        ("test_accuracy", "held-out accuracy (%)", 100.0),
        ("samples_per_s", "training samples/s", 1.0),
        ("peak_memory_mb", "peak memory (MB)", 1.0),
    ]
    names = list(results)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.6))
    for ax, (key, label, scale) in zip(axes, metrics, strict=True):
        values = [(results[n].get(key) or 0.0) * scale for n in names]
        bars = ax.bar(names, values, color=["tab:orange", "tab:gray"][: len(names)])
        ax.bar_label(bars, fmt="%.1f" if key != "test_accuracy" else "%.2f")
        ax.margins(y=0.12)  # room for the labels above the bars
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
