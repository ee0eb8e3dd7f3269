"""fastops.swap_modules: parity of outputs and gradients, unchanged state_dict keys, filter, undo."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fastops
from fastops.train.model import ConvNet


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.dw_strided = nn.Conv2d(6, 6, 5, stride=2, padding=2, dilation=1, groups=6, bias=False)
        self.dense = nn.Conv2d(6, 6, 3, padding=1)  # not depthwise: left alone
        self.grouped = nn.Conv2d(6, 6, 3, padding=1, groups=3)  # grouped, not depthwise: left alone
        self.reflect = nn.Conv2d(6, 6, 3, padding=1, groups=6, padding_mode="reflect")  # reported, kept
        self.act = nn.GELU(approximate="tanh")
        self.mlp = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 12), nn.GELU(), nn.Linear(12, 3))
        self.lone = nn.Linear(6, 6)  # a Linear not followed by a GELU inside a Sequential

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.dw(x))
        x = self.reflect(self.grouped(self.dense(x)))
        x = self.dw_strided(x).mean((2, 3))
        return self.mlp(self.lone(x))


def _types(model: nn.Module) -> dict[str, type]:
    return {name: type(m) for name, m in model.named_modules()}


def test_swap_parity_keys_and_undo() -> None:
    torch.manual_seed(0)
    model = Net().double()
    x = torch.randn(4, 6, 9, 11, dtype=torch.float64, requires_grad=True)
    ref = model(x)
    (ref_gx,) = torch.autograd.grad(ref.square().sum(), x)
    ref_grads = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))
    params_before = dict(model.named_parameters())
    keys_before = list(model.state_dict())
    types_before = _types(model)

    report = fastops.swap_modules(model)

    assert report.counts() == {
        "nn.Conv2d -> fastops.nn.DepthwiseConv2d": 2,
        "nn.GELU -> fastops.nn.GELU": 1,
        "nn.Linear -> fastops.nn.LinearGELU": 2,
        "nn.GELU -> nn.Identity": 2,
    }
    assert [s.name for s in report.skipped] == ["reflect"]
    assert "padding_mode" in report.skipped[0].reason
    assert isinstance(model.dw, fastops.nn.DepthwiseConv2d)
    assert isinstance(model.act, fastops.nn.GELU) and model.act.approximate == "tanh"
    assert isinstance(model.mlp[0], fastops.nn.LinearGELU) and isinstance(model.mlp[1], nn.Identity)
    assert (
        type(model.dense) is nn.Conv2d and type(model.grouped) is nn.Conv2d and type(model.lone) is nn.Linear
    )
    # Same keys, and the very same Parameter objects (so optimizers and checkpoints keep working).
    assert list(model.state_dict()) == keys_before
    for name, p in model.named_parameters():
        assert p is params_before[name], name

    out = model(x)
    torch.testing.assert_close(out, ref)
    (gx,) = torch.autograd.grad(out.square().sum(), x)
    torch.testing.assert_close(gx, ref_gx)
    grads = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
    assert "dw: nn.Conv2d -> fastops.nn.DepthwiseConv2d" in str(report)

    report.undo()
    assert _types(model) == types_before
    for name, p in model.named_parameters():
        assert p is params_before[name], name
    torch.testing.assert_close(model(x), ref)
    try:
        report.undo()
    except RuntimeError as e:
        assert "already been undone" in str(e)
    else:
        raise AssertionError("a second undo must raise")


def test_filter_fn_limits_the_swap() -> None:
    model = Net()
    seen: list[str] = []

    def only_dw(module: nn.Module, name: str) -> bool:
        seen.append(name)
        return name == "dw"

    report = fastops.swap_modules(model, filter_fn=only_dw)
    assert [r.name for r in report.replaced] == ["dw"]
    assert {"dw", "dw_strided", "act", "mlp.0", "mlp.2"} <= set(seen)
    assert type(model.act) is nn.GELU and type(model.mlp[0]) is nn.Linear


def test_swap_keeps_train_eval_mode_and_subclasses() -> None:
    class MyGELU(nn.GELU):  # a subclass may change forward(): never swapped
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    model = nn.Sequential(nn.Conv2d(4, 4, 3, groups=4), MyGELU(), nn.GELU()).eval()
    report = fastops.swap_modules(model)
    assert [r.name for r in report.replaced] == ["0", "2"]
    assert type(model[1]) is MyGELU
    assert not model[0].training and not model[2].training


def test_swap_main_job_model_matches_stock() -> None:
    torch.manual_seed(0)
    model = ConvNet(1, 10, image_size=16, width=8, dropout=0.0)
    x = torch.randn(5, 1, 16, 16)
    ref = model(x)
    report = fastops.swap_modules(model)
    kinds = report.counts()
    assert kinds["nn.Conv2d -> fastops.nn.DepthwiseConv2d"] == len(model.blocks)
    assert kinds["nn.Linear -> fastops.nn.LinearGELU"] == len(model.blocks) + 1  # SE of each block + head
    torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-5)


def test_rejects_non_modules() -> None:
    try:
        fastops.swap_modules(torch.zeros(3))  # type: ignore[arg-type]
    except TypeError as e:
        assert "expected an nn.Module" in str(e)
    else:
        raise AssertionError("expected a TypeError")


class Softplus2(nn.Module):
    """A user's own activation, for which the user registers a swap rule."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.softplus(x) * 2


class FusedSoftplus2(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.softplus(x).mul(2)


def test_user_registered_rules() -> None:
    from fastops.swap import _RULES, SwapRule, register_swap_rule, swap_rules

    saved = list(_RULES)
    try:
        rule = SwapRule(
            "softplus2",
            matches=lambda m: type(m) is Softplus2,
            replace=lambda m: FusedSoftplus2(),
            skip_reason=lambda m: "kept on purpose" if getattr(m, "keep", False) else None,
        )
        register_swap_rule(rule)
        register_swap_rule(rule)
        assert sum(getattr(r, "name", "") == "softplus2" for r in swap_rules()) == 1  # replaced, not doubled
        model = nn.Sequential(Softplus2(), nn.Sequential(Softplus2()), nn.GELU())
        report = fastops.swap_modules(model)
        assert [type(m) for m in (model[0], model[1][0], model[2])] == [
            FusedSoftplus2,
            FusedSoftplus2,
            fastops.nn.GELU,
        ]
        assert [r.name for r in report.replaced] == ["0", "1.0", "2"]
        kept = Softplus2()
        kept.keep = True
        report = fastops.swap_modules(nn.Sequential(kept))
        assert not report.replaced and [(s.name, s.reason) for s in report.skipped] == [
            ("0", "kept on purpose")
        ]
        with pytest.raises(TypeError, match=r"expected a SwapRule or PairRule"):
            register_swap_rule(lambda m: True)  # type: ignore[arg-type]
    finally:
        _RULES[:] = saved
