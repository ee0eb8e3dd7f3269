"""fastops.nn.SqueezeExcite: parity with the plain SE block it replaces, shared Parameters and state_dict
keys, the swap rule's skip reasons. The real timm / torchvision classes: tests/models/test_squeeze_excite_models.py."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import fastops
from tests.helpers import devices


class SEBlock(nn.Module):
    """The plain SE block of docs/squeeze_excite.md."""

    def __init__(self, channels: int, reduced: int, act: nn.Module, gate: nn.Module) -> None:
        super().__init__()
        self.fc1 = nn.Linear(channels, reduced)
        self.act = act
        self.fc2 = nn.Linear(reduced, channels)
        self.gate = gate

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(x.mean((2, 3))))))[:, :, None, None]


class NotSE(SEBlock):
    """The same children, another forward: must not be swapped."""

    def forward(self, x: Tensor) -> Tensor:
        return x + self.gate(self.fc2(self.act(self.fc1(x.mean((2, 3))))))[:, :, None, None]


ACT_GATES = [
    (nn.ReLU(inplace=True), nn.Hardsigmoid()),
    (nn.SiLU(), nn.Sigmoid()),
    (nn.GELU(), nn.Sigmoid()),
]


@devices
@pytest.mark.parametrize("act,gate", ACT_GATES, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_module_matches_the_block_it_replaces(
    device: str, act: nn.Module, gate: nn.Module, layout: str
) -> None:
    torch.manual_seed(0)
    block = SEBlock(24, 6, act, gate).to(device)
    twin = fastops.nn.SqueezeExcite.from_torch(block)
    assert twin.fc1.weight is block.fc1.weight and twin.fc2.bias is block.fc2.bias
    assert list(twin.state_dict()) == list(block.state_dict())
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(3, 24, 7, 5, device=device).contiguous(memory_format=fmt).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    y, y_ref = twin(x), block(x_ref)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, *block.parameters()], g)
    want = torch.autograd.grad(y_ref, [x_ref, *block.parameters()], g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_swap_modules_replaces_plain_blocks_and_keeps_state_dict() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3), SEBlock(16, 4, nn.SiLU(), nn.Sigmoid()), NotSE(16, 4, nn.ReLU(), nn.Sigmoid())
    )
    stock = copy.deepcopy(model)
    keys = list(model.state_dict())
    report = fastops.swap_modules(model)
    assert type(model[1]) is fastops.nn.SqueezeExcite and type(model[2]) is NotSE
    assert [s.name for s in report.skipped] == ["2"] and "forward is not" in report.skipped[0].reason
    assert list(model.state_dict()) == keys
    model.load_state_dict(stock.state_dict())
    x = torch.randn(2, 3, 9, 9)
    torch.testing.assert_close(model(x), stock(x))
    report.undo()
    assert type(model[1]) is SEBlock


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda: SEBlock(8, 2, nn.Tanh(), nn.Sigmoid()), "activation Tanh is not one of the fused ones"),
        (lambda: SEBlock(8, 2, nn.GELU(approximate="tanh"), nn.Sigmoid()), "GELU(approximate='tanh')"),
        (lambda: SEBlock(8, 2, nn.ReLU(), nn.Softmax(dim=1)), "gate Softmax is not one of the fused ones"),
    ],
)
def test_unknown_act_or_gate_is_skipped_with_the_reason(make, words: str) -> None:  # noqa: ANN001
    model = nn.Sequential(make())
    report = fastops.swap_modules(model)
    # The block stays stock (its children may still be swapped on their own: a GELU(tanh) is).
    assert type(model[0]) is SEBlock and not any(r.name == "0" for r in report.replaced)
    assert [s.name for s in report.skipped] == ["0"] and words in report.skipped[0].reason
    with pytest.raises(ValueError, match="from_torch: "):
        fastops.nn.SqueezeExcite.from_torch(model[0])


def test_hooked_fc_is_skipped() -> None:
    block = SEBlock(8, 2, nn.ReLU(), nn.Sigmoid())
    block.fc1.register_forward_hook(lambda *a: None)
    report = fastops.swap_modules(nn.Sequential(block))
    assert "fc1 has forward/backward hooks" in report.skipped[0].reason


def test_fc_with_a_state_dict_hook_is_skipped() -> None:
    """The swap's shared check (fastops.swap_rules.unsafe_to_replace) also covers an FC's state_dict hooks."""
    block = SEBlock(8, 2, nn.ReLU(), nn.Sigmoid())
    block.fc1._register_state_dict_hook(lambda *a: None)
    model = nn.Sequential(block)
    report = fastops.swap_modules(model)
    assert type(model[0]) is SEBlock and "fc1: has state_dict hooks" in report.skipped[0].reason


def test_module_construction_and_errors() -> None:
    m = fastops.nn.SqueezeExcite(
        32, 8, "silu", "hardsigmoid", conv=True, fc_names=("conv_reduce", "conv_expand")
    )
    assert m.conv_reduce.weight.shape == (8, 32, 1, 1) and "gate='hardsigmoid'" in repr(m)
    y = m(torch.randn(2, 32, 3, 3))
    assert y.shape == (2, 32, 3, 3)
    with pytest.raises(ValueError, match=r"fastops\.nn\.SqueezeExcite: expected act to be one of"):
        fastops.nn.SqueezeExcite(8, 2, act="tanh")
    with pytest.raises(ValueError, match=r"fastops\.nn\.SqueezeExcite: expected reduced_channels"):
        fastops.nn.SqueezeExcite(8, 0)
    with pytest.raises(TypeError, match=r"SqueezeExcite\.from_torch: expected an SE block"):
        fastops.nn.SqueezeExcite.from_torch(nn.ReLU())


def test_module_under_autocast_and_compile() -> None:
    torch.manual_seed(0)
    m = fastops.nn.SqueezeExcite(16, 4, "silu", "sigmoid")
    x = torch.randn(2, 16, 5, 5).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x.bfloat16())
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert m.fc1.weight.grad is not None and m.fc1.weight.grad.dtype == torch.float32
    compiled = torch.compile(m, fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x))
