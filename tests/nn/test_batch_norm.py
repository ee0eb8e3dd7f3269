"""fastops.nn.BatchNorm2d: training parity with nn.BatchNorm2d (outputs, gradients, running statistics,
num_batches_tracked), its options, the swap rule, and undo."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fastops
from tests.helpers import devices


def _pair(device: str, **kwargs: object) -> tuple[nn.BatchNorm2d, fastops.nn.BatchNorm2d]:
    torch.manual_seed(0)
    stock = nn.BatchNorm2d(6, **kwargs).to(device)  # type: ignore[arg-type]
    if stock.affine:
        with torch.no_grad():
            stock.weight.uniform_(0.5, 1.5)
            stock.bias.uniform_(-0.5, 0.5)
    ours = fastops.nn.BatchNorm2d.from_torch(copy.deepcopy(stock))
    ours.backend = "fastops"  # our kernels, whatever the policy says about this device
    return stock, ours


@devices
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"momentum": None},
        {"affine": False},
        {"track_running_stats": False},
        {"eps": 1e-3, "momentum": 0.3},
    ],
    ids=["default", "cumulative", "no-affine", "no-running-stats", "eps-momentum"],
)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_trains_and_evaluates_like_nn_batchnorm2d(device: str, options: dict, channels_last: bool) -> None:
    stock, ours = _pair(device, **options)
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        x = (torch.randn(8, 6, 5, 7, generator=gen) * 2 + 1).to(device)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        g = torch.randn(x.shape, generator=gen).to(device)
        if step == 3:  # the last step in eval mode: the running statistics normalise
            stock.eval()
            ours.eval()
        xs, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        ys, yo = stock(xs), ours(xo)
        torch.testing.assert_close(yo, ys, rtol=1e-5, atol=1e-5)
        assert yo.is_contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format
        )
        ys.backward(g)
        yo.backward(g)
        torch.testing.assert_close(xo.grad, xs.grad, rtol=1e-5, atol=1e-5)
        for name, p in stock.named_parameters():
            torch.testing.assert_close(ours.get_parameter(name).grad, p.grad, rtol=1e-5, atol=1e-5)
    for name, b in stock.named_buffers():
        torch.testing.assert_close(ours.get_buffer(name), b, msg=name)


def test_from_torch_shares_parameters_and_buffers() -> None:
    stock = nn.BatchNorm2d(4)
    ours = fastops.nn.BatchNorm2d.from_torch(stock)
    assert isinstance(ours, nn.BatchNorm2d)
    for name in ("weight", "bias"):
        assert ours.get_parameter(name) is stock.get_parameter(name)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert ours.get_buffer(name) is stock.get_buffer(name)
    assert list(ours.state_dict()) == list(stock.state_dict())
    ours(torch.randn(3, 4, 2, 2))
    assert int(stock.num_batches_tracked) == 1  # one set of statistics, advanced once
    with pytest.raises(
        TypeError, match=r"fastops\.nn\.BatchNorm2d\.from_torch: expected a torch\.nn\.BatchNorm2d"
    ):
        fastops.nn.BatchNorm2d.from_torch(nn.BatchNorm1d(4))  # type: ignore[arg-type]


def test_rejects_what_nn_batchnorm2d_rejects() -> None:
    m = fastops.nn.BatchNorm2d(3)
    with pytest.raises(ValueError, match="expected 4D input"):
        m(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        m(torch.randn(1, 3, 1, 1))


def test_swap_replaces_batchnorm2d_and_undo_restores_it() -> None:
    class ActBatchNorm(nn.BatchNorm2d):  # a subclass that does more in forward: not ours to replace
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(super().forward(x))

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.GELU(), ActBatchNorm(4))
    stock_state = copy.deepcopy(model.state_dict())
    report = fastops.swap_modules(model)
    assert type(model[1]) is fastops.nn.BatchNorm2d
    assert type(model[3]) is ActBatchNorm
    assert any(s.name == "3" and "overrides forward()" in s.reason for s in report.skipped)
    assert list(model.state_dict()) == list(stock_state)
    model(torch.randn(2, 3, 6, 6))
    report.undo()
    assert type(model[1]) is nn.BatchNorm2d
    assert int(model[1].num_batches_tracked) == 1  # the step taken while swapped is kept


class _FreezableBatchNorm(nn.BatchNorm2d):
    """Forward is nn.BatchNorm2d's, but other methods are its own (timm's FrozenBatchNorm2d idiom,
    and a _check_input_dim that takes (C, H, W) input)."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() not in (3, 4):
            raise ValueError(f"expected 3D or 4D input (got {input.dim()}D input)")

    def freeze(self) -> None:
        self.eval()
        self.weight.requires_grad_(False)


class _PlainSubclass(nn.BatchNorm2d):
    def __init__(self, num_features: int) -> None:
        super().__init__(num_features, momentum=0.2)


def test_subclasses_with_their_own_methods_are_skipped() -> None:
    model = nn.Sequential(_FreezableBatchNorm(3), _PlainSubclass(3))
    x = torch.randn(2, 3, 5, 5)
    report = fastops.swap_modules(model)
    assert type(model[0]) is _FreezableBatchNorm
    [skipped] = report.skipped
    assert skipped.name == "0" and "defines _check_input_dim, freeze" in skipped.reason
    model[0].freeze()
    torch.testing.assert_close(model[0](x), nn.functional.batch_norm(x, *_stats(model[0])))
    assert type(model[1]) is fastops.nn.BatchNorm2d and model[1].momentum == 0.2  # only __init__


def _stats(m: nn.BatchNorm2d) -> tuple:
    return m.running_mean, m.running_var, m.weight, m.bias, False, 0.0, m.eps


def test_what_nn_batchnorm2d_accepts_works_after_a_swap() -> None:
    """momentum outside [0, 1] runs as in torch; eps=0 (torch refuses it only when training) keeps
    the stock module, with the reason."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5)
    model = nn.Sequential(nn.BatchNorm2d(3, momentum=1.5), nn.BatchNorm2d(3, eps=0.0).eval())
    stock = copy.deepcopy(model)
    report = fastops.swap_modules(model)
    assert type(model[0]) is fastops.nn.BatchNorm2d and type(model[1]) is nn.BatchNorm2d
    assert [s.name for s in report.skipped] == ["1"] and "eps=0.0" in report.skipped[0].reason
    model[0].backend = "fastops"
    torch.testing.assert_close(model(x), stock(x))
    torch.testing.assert_close(model[0].running_mean, stock[0].running_mean)
    torch.testing.assert_close(model[0].running_var, stock[0].running_var)


def test_undo_after_a_conversion_keeps_the_running_statistics() -> None:
    """model.double() (like .to(device)) gives the twin new buffer tensors; undo hands them back, so
    the restored nn.BatchNorm2d has the statistics of the steps taken, in the new dtype."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    report = fastops.swap_modules(model)
    model.double()
    model(torch.randn(2, 3, 6, 6, dtype=torch.float64))
    twin = model[1]
    report.undo()
    restored = model[1]
    assert type(restored) is nn.BatchNorm2d
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert restored.get_buffer(name) is twin.get_buffer(name)
    assert restored.running_mean.dtype == torch.float64 and int(restored.num_batches_tracked) == 1
    model(torch.randn(2, 3, 6, 6, dtype=torch.float64))  # runs: weights and statistics agree in dtype


def test_under_autocast_and_compile() -> None:
    stock, ours = _pair("cpu")
    x = torch.randn(4, 6, 5, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        conv = nn.Conv2d(6, 6, 1)
        y = ours(conv(x))
    assert y.dtype == torch.bfloat16 and ours.running_mean.dtype == torch.float32
    compiled = torch.compile(ours, fullgraph=True)
    stock.train()
    torch.testing.assert_close(compiled(x), stock(x), rtol=1e-5, atol=1e-5)


def test_batch_norm_act_module() -> None:
    """BatchNormAct2d = act(drop(BatchNorm2d)); timm's class is swapped to it (tests/models)."""
    torch.manual_seed(0)
    m = fastops.nn.BatchNormAct2d(4, act=nn.ReLU())
    stock = nn.BatchNorm2d(4)
    x = torch.randn(3, 4, 5, 5)
    torch.testing.assert_close(m(x), torch.relu(stock(x)), rtol=1e-5, atol=1e-5)
    assert list(m.state_dict()) == list(stock.state_dict())
    with pytest.raises(
        TypeError, match=r"fastops\.nn\.BatchNormAct2d\.from_torch: expected timm's BatchNormAct2d"
    ):
        fastops.nn.BatchNormAct2d.from_torch(nn.BatchNorm2d(4))
