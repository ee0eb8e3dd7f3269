"""fastops.swap_modules: parity of outputs and gradients, unchanged state_dict keys, filter, undo."""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

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


class _Gated(nn.Sequential):
    """A Sequential whose own forward uses its first child's output twice: ``gelu(l(x)) * l(x)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self[1](self[0](x)) * self[0](x)


def test_linear_gelu_pair_is_not_fused_where_the_container_uses_the_linear_apart() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_Gated(nn.Linear(5, 5), nn.GELU()), nn.Sequential(nn.Linear(5, 5), nn.GELU()))
    x = torch.randn(4, 5)
    want = model(x)
    report = fastops.swap_modules(model)
    assert type(model[0][0]) is nn.Linear  # the gated pair is kept: its GELU alone is swapped
    assert type(model[0][1]) is fastops.nn.GELU
    assert type(model[1][0]) is fastops.nn.LinearGELU  # a plain Sequential still fuses
    [skipped] = [s for s in report.skipped if s.name == "0.0"]
    assert "overrides nn.Sequential.forward()" in skipped.reason
    torch.testing.assert_close(model(x), want)


def test_one_module_in_several_places_stays_one_module() -> None:
    """A BatchNorm used twice (one object, one set of running statistics) becomes one twin in both
    places, so a conversion after the swap (the Trainer's .to(device)) keeps their state shared."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    inner = nn.Sequential(bn, nn.ReLU())
    stock = nn.Sequential(bn, nn.GELU(), bn, inner)  # bn at 0, 2 and in a second parent
    model = copy.deepcopy(stock)
    report = fastops.swap_modules(model)
    assert type(model[0]) is fastops.nn.BatchNorm2d
    assert model[0] is model[2] is model[3][0]
    assert [r.name for r in report.replaced if r.new is model[0]] == ["0", "2", "3.0"]
    model.double()
    stock.double()
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(model(x), stock(x))
    assert model[2].running_mean is model[0].running_mean
    torch.testing.assert_close(model[2].running_mean, stock[2].running_mean)
    torch.testing.assert_close(model[3][0].running_var, stock[3][0].running_var)
    report.undo()
    assert type(model[2]) is nn.BatchNorm2d and model[0] is model[2] is model[3][0]
    torch.testing.assert_close(model[2].running_var, stock[2].running_var)


def test_swap_main_job_model_matches_stock() -> None:
    torch.manual_seed(0)
    model = ConvNet(1, 10, image_size=16, width=8, dropout=0.0)
    x = torch.randn(5, 1, 16, 16)
    ref = model(x)
    report = fastops.swap_modules(model)
    kinds = report.counts()
    assert kinds["nn.Conv2d -> fastops.nn.DepthwiseConv2d"] == len(model.blocks)
    assert kinds["fastops.train.model.SqueezeExcite -> fastops.nn.SqueezeExcite"] == len(model.blocks)
    assert kinds["nn.Linear -> fastops.nn.LinearGELU"] == 1  # the head
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
    from fastops.swap_rules import _RULES, SwapRule, register_swap_rule, swap_rules

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


# --- Stand-ins for timm's classes: same class paths and forwards, so no timm is needed here. ---


class TimmGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x)


class TimmGELUTanh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x, approximate="tanh")


TimmGELU.__module__ = TimmGELUTanh.__module__ = "timm.layers.activations"
TimmGELU.__name__ = TimmGELU.__qualname__ = "GELU"
TimmGELUTanh.__name__ = TimmGELUTanh.__qualname__ = "GELUTanh"


def _tf_same_pad(x: torch.Tensor, k: tuple[int, ...], s: tuple[int, ...], d: tuple[int, ...]) -> torch.Tensor:
    # timm.layers.padding.pad_same, written out.
    pads = []
    for extent, kk, ss, dd in zip(x.shape[2:], k, s, d, strict=True):
        pads.append(max((math.ceil(extent / ss) - 1) * ss + (kk - 1) * dd + 1 - extent, 0))
    ph, pw = pads
    return nn.functional.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))


class TimmConv2dSame(nn.Conv2d):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, padding=0, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _tf_same_pad(x, self.weight.shape[-2:], self.stride, self.dilation)
        return nn.functional.conv2d(
            x, self.weight, self.bias, self.stride, (0, 0), self.dilation, self.groups
        )


TimmConv2dSame.__module__ = "timm.layers.conv2d_same"
TimmConv2dSame.__name__ = TimmConv2dSame.__qualname__ = "Conv2dSame"


class TimmMlp(nn.Module):
    def __init__(
        self,
        features: int,
        hidden: int,
        act: type[nn.Module] = TimmGELU,
        drop: float = 0.0,
        norm: bool = False,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.act = act()
        self.drop1 = nn.Dropout(drop)
        self.norm = nn.LayerNorm(hidden) if norm else nn.Identity()
        self.fc2 = nn.Linear(hidden, features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class ResidualMlp(TimmMlp):
    """Same children, a different forward: recognised by structure, then refused by the probe."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + super().forward(x)


def _outputs_and_grads(model: nn.Module, x: torch.Tensor, seed: int = 0) -> list[torch.Tensor]:
    x = x.detach().requires_grad_()
    torch.manual_seed(seed)
    out = model(x)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.square().sum(), [x, *params])
    return [out.detach(), *grads]


def _assert_same_behaviour(before: list[torch.Tensor], after: list[torch.Tensor]) -> None:
    assert len(before) == len(after)
    for b, a in zip(before, after, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_timm_gelus_are_gelu_by_contract() -> None:
    model = nn.Sequential(TimmGELU(), TimmGELUTanh(), nn.Sequential(nn.Linear(5, 7), TimmGELUTanh())).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    before = _outputs_and_grads(model, x)
    report = fastops.swap_modules(model)
    assert [(r.name, r.new_type) for r in report.replaced] == [
        ("2.0", "fastops.nn.LinearGELU"),
        ("2.1", "nn.Identity"),
        ("0", "fastops.nn.GELU"),
        ("1", "fastops.nn.GELU"),
    ] or sorted(r.name for r in report.replaced) == ["0", "1", "2.0", "2.1"]
    assert (model[0].approximate, model[1].approximate, model[2][0].approximate) == ("none", "tanh", "tanh")
    assert not report.skipped
    _assert_same_behaviour(before, _outputs_and_grads(model, x))


def test_register_gelu_module_and_the_probe_that_checks_it() -> None:
    from fastops.nn import gelu as gelu_module

    class MyGELU(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))

    class NotAGELU(nn.Module):  # registered by mistake: the probe catches it
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x)

    saved = dict(gelu_module._GELU_MODULES)
    try:
        fastops.nn.register_gelu_module(MyGELU)
        fastops.nn.register_gelu_module(f"{NotAGELU.__module__}.{NotAGELU.__qualname__}", approximate="tanh")
        model = nn.Sequential(MyGELU(), NotAGELU())
        report = fastops.swap_modules(model)
        assert [r.name for r in report.replaced] == ["0"] and type(model[0]) is fastops.nn.GELU
        assert [s.name for s in report.skipped] == ["1"] and type(model[1]) is NotAGELU
        assert "registered as GELU(approximate='tanh')" in report.skipped[0].reason
        assert "does not compute what the swap assumes" in report.skipped[0].reason
        with pytest.raises(ValueError, match=r"register_gelu_module: expected approximate"):
            fastops.nn.register_gelu_module(MyGELU, approximate="fast")
        with pytest.raises(TypeError, match=r"register_gelu_module: expected cls"):
            fastops.nn.register_gelu_module("MyGELU")
    finally:
        gelu_module._GELU_MODULES.clear()
        gelu_module._GELU_MODULES.update(saved)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kernel_size", [3, 5])
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv2d_same_becomes_depthwise_conv2d_same(
    stride: int, kernel_size: int, channels_last: bool
) -> None:
    conv = TimmConv2dSame(4, 4, kernel_size, stride=stride, groups=4).double()
    model = nn.Sequential(conv)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    inputs = [
        torch.randn(2, 4, h, w, dtype=torch.float64).contiguous(memory_format=fmt)
        for h, w in ((9, 8), (6, 7))
    ]
    before = [_outputs_and_grads(model, x) for x in inputs]
    report = fastops.swap_modules(model)
    assert report.counts() == {"timm.layers.conv2d_same.Conv2dSame -> fastops.nn.DepthwiseConv2dSame": 1}
    assert model[0].weight is conv.weight and list(model.state_dict()) == ["0.weight", "0.bias"]
    assert "padding='tf_same'" in repr(model[0])
    for x, expected in zip(inputs, before, strict=True):  # one module, every input size
        _assert_same_behaviour(expected, _outputs_and_grads(model, x))


def test_conv2d_subclasses_swapped_only_when_provably_equivalent() -> None:
    class Renamed(nn.Conv2d):  # forward unchanged: a plain depthwise conv
        pass

    class Scaled(nn.Conv2d):  # forward changed, not registered: skipped, with why
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    class ExportSame(TimmConv2dSame):  # a registered path, but the class is another: not trusted
        pass

    model = nn.Sequential(
        Renamed(3, 3, 3, padding=1, groups=3),
        Scaled(3, 3, 3, padding=1, groups=3),
        ExportSame(3, 3, 3, groups=3),
        TimmConv2dSame(3, 6, 3),  # not depthwise: not a candidate
    ).double()
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64)
    before = _outputs_and_grads(model, x)
    report = fastops.swap_modules(model)
    assert [(r.name, r.new_type) for r in report.replaced] == [("0", "fastops.nn.DepthwiseConv2d")]
    assert [s.name for s in report.skipped] == ["1", "2"]
    assert all("overrides forward()" in s.reason for s in report.skipped)
    assert "register_same_padding_conv2d" in report.skipped[0].reason
    _assert_same_behaviour(before, _outputs_and_grads(model, x))


def test_register_same_padding_conv2d() -> None:
    from fastops.nn import depthwise_conv2d as dw_module

    class MySame(TimmConv2dSame):
        pass

    class NotSame(nn.Conv2d):  # registered by mistake: no padding at all
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x)

    saved = set(dw_module._SAME_PADDING_CONV2D)
    try:
        fastops.nn.register_same_padding_conv2d(MySame)
        fastops.nn.register_same_padding_conv2d(NotSame)
        model = nn.Sequential(MySame(3, 3, 3, stride=2, groups=3), NotSame(3, 3, 3, groups=3))
        report = fastops.swap_modules(model)
        assert [r.name for r in report.replaced] == ["0"] and type(model[0]) is fastops.nn.DepthwiseConv2dSame
        assert [s.name for s in report.skipped] == ["1"]
        assert "registered as a TensorFlow 'same' conv" in report.skipped[0].reason
        with pytest.raises(TypeError, match=r"register_same_padding_conv2d: expected cls"):
            fastops.nn.register_same_padding_conv2d(3)  # type: ignore[arg-type]
    finally:
        dw_module._SAME_PADDING_CONV2D.clear()
        dw_module._SAME_PADDING_CONV2D.update(saved)


@pytest.mark.parametrize(
    ("act", "drop", "norm"),
    [(TimmGELU, 0.0, False), (nn.GELU, 0.0, True), (TimmGELUTanh, 0.3, False)],
    ids=["timm_gelu", "norm", "dropout"],
)
def test_mlp_block_becomes_linear_gelu_mlp(act: type[nn.Module], drop: float, norm: bool) -> None:
    """Dropout of any rate and any norm are kept: the block reuses those very modules, in order, so
    even training-mode dropout draws the same masks."""
    model = nn.Sequential(TimmMlp(6, 10, act, drop, norm), nn.Linear(6, 2)).double().train()
    x = torch.randn(4, 3, 6, dtype=torch.float64)
    keys = list(model.state_dict())
    before = _outputs_and_grads(model, x, seed=7)
    report = fastops.swap_modules(model)
    assert report.counts() == {"tests.test_swap.TimmMlp -> fastops.nn.GELUMlp": 1}
    block = model[0]
    assert isinstance(block, fastops.nn.GELUMlp) and isinstance(block.fc1, fastops.nn.LinearGELU)
    assert block.fc1.approximate == ("tanh" if act is TimmGELUTanh else "none")
    assert list(model.state_dict()) == keys
    assert [name for name, _ in block.named_children()] == ["fc1", "act", "drop1", "norm", "fc2", "drop2"]
    _assert_same_behaviour(before, _outputs_and_grads(model, x, seed=7))
    report.undo()
    assert type(model[0]) is TimmMlp and type(model[0].act) is act


def test_conv_mlp_block_fuses_its_1x1_conv() -> None:
    """timm's Mlp(use_conv=True) (ConvNeXt-Atto): fc1 is a 1x1 conv on NCHW input."""
    block = TimmMlp(6, 10)
    block.fc1, block.fc2 = nn.Conv2d(6, 10, 1), nn.Conv2d(10, 6, 1)
    model = nn.Sequential(block).double()
    keys = list(model.state_dict())
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(2, 6, 5, 4, dtype=torch.float64).contiguous(memory_format=fmt)
        fresh = copy.deepcopy(model)
        before = _outputs_and_grads(fresh, x)
        weight = fresh[0].fc1.weight
        report = fastops.swap_modules(fresh)
        assert type(fresh[0]) is fastops.nn.GELUMlp and type(fresh[0].fc1) is fastops.nn.PointwiseConvGELU
        assert fresh[0].fc1.weight is weight and list(fresh.state_dict()) == keys
        assert len(report.replaced) == 1
        _assert_same_behaviour(before, _outputs_and_grads(fresh, x))


def test_mlp_blocks_that_are_not_skipped_with_why() -> None:
    conv_mlp = TimmMlp(6, 10)
    conv_mlp.fc1 = nn.Conv2d(6, 10, 3, padding=1)  # a 3x3 conv: no fused twin
    model = nn.ModuleDict({"residual": ResidualMlp(6, 10), "conv": conv_mlp}).double()
    report = fastops.swap_modules(model)
    skipped = {s.name: s.reason for s in report.skipped}
    assert set(skipped) == {"residual", "conv"}
    assert "does not compute what the swap assumes" in skipped["residual"]
    assert "fc1 is an nn.Conv2d other than 1x1" in skipped["conv"]
    # Left alone as blocks, their GELUs are still swapped on their own.
    assert sorted(r.name for r in report.replaced) == ["conv.act", "residual.act"]
    assert type(model["residual"]) is ResidualMlp


def _add_one(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
    return output + 1


def _scale_input(module: nn.Module, args: Any) -> tuple[torch.Tensor]:
    return (args[0] * 3,)


def _halve_grad(module: nn.Module, grad_input: Any, grad_output: Any) -> tuple[torch.Tensor | None, ...]:
    return tuple(None if g is None else g / 2 for g in grad_input)


def test_hooked_modules_are_skipped_and_hooks_keep_their_effect() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 3, 3, padding=1, groups=3),  # 0: forward pre-hook
        nn.GELU(),  # 1: forward hook
        nn.Flatten(),
        nn.Sequential(nn.Linear(48, 8), nn.GELU()),  # 3.0: backward hook, so the pair is skipped
        TimmMlp(8, 12),  # 4: its act has a forward hook
        nn.GELU(),  # 5: plain, swapped
    ).double()
    model[0].register_forward_pre_hook(_scale_input)
    model[1].register_forward_hook(_add_one)
    model[3][0].register_full_backward_hook(_halve_grad)
    model[4].act.register_forward_hook(_add_one)
    model.register_forward_hook(_add_one)  # on the model itself, which is never replaced
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    before = _outputs_and_grads(model, x)
    report = fastops.swap_modules(model)
    skipped = {s.name: s.reason for s in report.skipped}
    assert skipped["0"].startswith("has forward pre-hooks")
    assert skipped["1"].startswith("has forward hooks")
    assert skipped["3.0"].startswith("has backward hooks")
    assert skipped["4"].startswith("act: has forward hooks")
    assert skipped["4.act"].startswith("has forward hooks")
    assert sorted(r.name for r in report.replaced) == ["3.1", "5"]  # the lone GELUs
    _assert_same_behaviour(before, _outputs_and_grads(model, x))


def test_pruned_weight_normed_and_parametrized_modules_are_skipped() -> None:
    from torch.nn.utils import parametrizations, parametrize, prune

    class Positive(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return w.abs()

    model = nn.Sequential(
        nn.Sequential(nn.Linear(6, 6), nn.GELU()),  # 0: pruned Linear -> GELU
        nn.Unflatten(1, (6, 1, 1)),
        nn.Conv2d(6, 6, 1, groups=6),  # 2: pruned depthwise conv (raised TypeError part-way before)
        nn.Conv2d(6, 6, 1, groups=6),  # 3: old-style weight_norm
        nn.Conv2d(6, 6, 1, groups=6),  # 4: parametrized
        nn.Flatten(),
        TimmMlp(6, 8),  # 6: fc1 under the new-style weight_norm parametrization
        nn.GELU(),  # 7: plain, swapped
    ).double()
    prune.l1_unstructured(model[0][0], "weight", amount=0.5)
    prune.random_unstructured(model[2], "weight", amount=0.5)
    with warnings.catch_warnings():  # the old-style weight_norm is deprecated, and still in use
        warnings.simplefilter("ignore", FutureWarning)
        torch.nn.utils.weight_norm(model[3])
    parametrize.register_parametrization(model[4], "weight", Positive())
    parametrizations.weight_norm(model[6].fc1)
    keys = list(model.state_dict())
    x = torch.randn(3, 6, dtype=torch.float64)
    before = _outputs_and_grads(model, x)
    report = fastops.swap_modules(model)
    skipped = {s.name: s.reason for s in report.skipped}
    assert skipped["0.0"].startswith("pruned") and skipped["2"].startswith("pruned")
    assert skipped["3"].startswith("weight_norm")
    assert skipped["4"].startswith("parametrized (weight")
    assert skipped["6"].startswith("fc1: parametrized (weight")
    assert sorted(r.name for r in report.replaced) == ["0.1", "6.act", "7"]
    assert list(model.state_dict()) == keys  # weight_orig, weight_mask, weight_g, ... all kept
    _assert_same_behaviour(before, _outputs_and_grads(model, x))
    _assert_same_behaviour(before, _outputs_and_grads(model, x))  # a second backward works too


def test_failing_rule_leaves_the_model_as_it_was() -> None:
    from fastops.swap_rules import _RULES, SwapRule, register_swap_rule

    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    def explode(m: nn.Module) -> nn.Module:
        raise TypeError("cannot build the twin")

    saved = list(_RULES)
    try:
        register_swap_rule(SwapRule("boom", matches=lambda m: type(m) is Boom, replace=explode))
        model = nn.Sequential(
            nn.GELU(), nn.Conv2d(2, 2, 3, groups=2), nn.Sequential(nn.Linear(2, 2), nn.GELU())
        )
        model.add_module("late", nn.Sequential(Boom()))
        types_before = _types(model)
        with pytest.raises(RuntimeError, match=r"swap rule 'boom' on late\.0 \(tests\.test_swap\.Boom\) failed: "
                           r"TypeError: cannot build the twin\. Nothing was swapped") as info:  # fmt: skip
            fastops.swap_modules(model)
        assert isinstance(info.value.__cause__, TypeError)
        assert _types(model) == types_before
    finally:
        _RULES[:] = saved


def test_global_module_hooks_see_depthwise_separable_conv2d_run() -> None:
    from torch.nn.modules.module import register_module_forward_hook

    model = fastops.nn.DepthwiseSeparableConv2d(4, 8, 3, padding=1).eval()
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=torch.channels_last)
    seen: list[type] = []

    def record(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        seen.append(type(module))
        return output * 2 if isinstance(module, fastops.nn.DepthwiseConv2d) else output

    with torch.no_grad():
        plain = model(x)
        handle = register_module_forward_hook(record)
        try:
            hooked = model(x)
        finally:
            handle.remove()
        fused_again = model(x)
    assert seen == [fastops.nn.DepthwiseConv2d, nn.Conv2d, fastops.nn.DepthwiseSeparableConv2d]
    pw = model.pointwise
    torch.testing.assert_close(hooked, nn.functional.conv2d(2 * model.depthwise(x), pw.weight, pw.bias))
    torch.testing.assert_close(fused_again, plain)


def test_swapped_modules_keep_the_stock_class_and_attributes() -> None:
    """isinstance-based code (weight init, fusion, feature info) still finds the twins, with the
    attributes of the module they replaced; a second swap finds nothing left to do."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(6, 6, 5, stride=2, padding=2, dilation=1, groups=6, bias=False),
        nn.Sequential(nn.Linear(6, 8), nn.GELU()),
        ConvMlp(),
    )
    stock = copy.deepcopy(model)
    report = fastops.swap_modules(model)
    conv, linear, pointwise = model[0], model[1][0], model[2].fc1
    assert type(conv) is fastops.nn.DepthwiseConv2d and isinstance(conv, nn.Conv2d)
    assert type(linear) is fastops.nn.LinearGELU and isinstance(linear, nn.Linear)
    assert type(pointwise) is fastops.nn.PointwiseConvGELU and isinstance(pointwise, nn.Conv2d)
    for ours, theirs in ((conv, stock[0]), (pointwise, stock[2].fc1)):
        for attr in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups"):
            assert getattr(ours, attr) == getattr(theirs, attr), attr
        assert (ours.padding_mode, ours.transposed, ours.output_padding) == ("zeros", False, (0, 0))
    assert (linear.in_features, linear.out_features) == (6, 8)
    assert len(report) > 0 and not report.skipped
    again = fastops.swap_modules(model)
    assert len(again) == 0 and not again.skipped


class ConvMlp(nn.Module):
    """timm's Mlp with a 1x1 conv fc1 (use_conv=True)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(6, 12, 1)
        self.act = nn.GELU()
        self.drop1 = nn.Identity()
        self.norm = nn.Identity()
        self.fc2 = nn.Conv2d(12, 6, 1)
        self.drop2 = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


_BAD_INPUTS = {
    "batch_norm, wrong channels": (lambda: nn.BatchNorm2d(3), torch.randn(2, 4, 5, 5)),
    "batch_norm, integer": (lambda: nn.BatchNorm2d(3), torch.ones(2, 3, 5, 5, dtype=torch.long)),
    "depthwise, wrong channels": (lambda: nn.Conv2d(3, 3, 3, groups=3), torch.randn(2, 4, 5, 5)),
    "depthwise, integer": (lambda: nn.Conv2d(3, 3, 3, groups=3), torch.ones(2, 3, 5, 5, dtype=torch.long)),
    "depthwise, complex": (lambda: nn.Conv2d(3, 3, 3, groups=3), torch.ones(2, 3, 5, 5, dtype=torch.cfloat)),
    "depthwise, 5-D": (lambda: nn.Conv2d(3, 3, 3, groups=3), torch.randn(1, 2, 3, 5, 5)),
    "depthwise, 2-D": (lambda: nn.Conv2d(3, 3, 3, groups=3), torch.randn(3, 5)),
    "gelu, integer": (lambda: nn.GELU(), torch.ones(3, dtype=torch.long)),
    "gelu, complex": (lambda: nn.GELU(), torch.ones(3, dtype=torch.cfloat)),
}


@pytest.mark.parametrize("case", list(_BAD_INPUTS))
def test_a_swapped_module_raises_what_the_stock_one_raises(case: str) -> None:
    """Code that catches the stock module's error catches ours, which names fastops and the op."""
    make, x = _BAD_INPUTS[case]
    stock = make()
    model = nn.Sequential(copy.deepcopy(stock))
    assert len(fastops.swap_modules(model)) == 1
    model[0].backend = "fastops"  # our kernels' checks, wherever the policy would send this input
    with pytest.raises(Exception) as theirs:
        stock(x)
    with pytest.raises(type(theirs.value), match=r"^fastops\.\w+: "):
        model(x)


@pytest.mark.parametrize(
    "module",
    [
        fastops.nn.BatchNorm2d(4),
        fastops.nn.BatchNormAct2d(4, act=nn.ReLU()),
        fastops.nn.GELU(),
        fastops.nn.BiasGELU(4),
        fastops.nn.LinearGELU(4, 4),
        fastops.nn.PointwiseConvGELU(4, 4),
        fastops.nn.DepthwiseConv2d(4, 3),
        fastops.nn.DepthwiseConv2dSame(4, 3),
        fastops.nn.DepthwiseSeparableConv2d(4, 4, 3),
        fastops.nn.SqueezeExcite(4, 2),
        fastops.nn.ClippedLog(),
    ],
    ids=lambda m: type(m).__name__,
)
def test_torch_jit_script_is_refused_naming_fastops_and_the_alternatives(module: nn.Module) -> None:
    """TorchScript cannot compile our forwards; it failed with its own errors pointing into our
    sources. The first line now names the module and points to trace / export."""
    with pytest.raises(RuntimeError) as error:
        torch.jit.script(nn.Sequential(nn.Identity(), module))
    first = str(error.value).splitlines()[0]
    assert first.startswith(f"fastops.nn.{type(module).__name__} cannot be compiled by torch.jit.script")
    assert "torch.jit.trace" in first and "torch.export" in first


def test_a_swapped_model_traces_where_script_is_refused() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 4, 3, groups=4), nn.BatchNorm2d(4), nn.GELU()).eval()
    torch.jit.script(model)  # the stock model scripts
    fastops.swap_modules(model)
    with pytest.raises(RuntimeError, match=r"^fastops\.nn\.DepthwiseConv2d cannot be compiled"):
        torch.jit.script(model)
    x = torch.randn(2, 4, 6, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, x)
    torch.testing.assert_close(traced(x), model(x))


class _Features(nn.Module):
    """Walks its Sequential child by child to collect every intermediate feature."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(5, 6), nn.GELU(), nn.Linear(6, 4))
        self.head = nn.Sequential(nn.Linear(4, 4), nn.GELU())  # called whole: fused

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        for layer in self.features:
            x = layer(x)
            feats.append(x)
        return [*feats, self.head(x)]


def test_a_sequential_walked_child_by_child_keeps_its_intermediate_outputs() -> None:
    torch.manual_seed(0)
    model = _Features()
    x = torch.randn(3, 5)
    want = model(x)
    report = fastops.swap_modules(model)
    assert type(model.features[0]) is nn.Linear and type(model.head[0]) is fastops.nn.LinearGELU
    [skipped] = [s for s in report.skipped if s.name == "features.0"]
    assert "uses self.features other than by calling it" in skipped.reason
    got = model(x)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
