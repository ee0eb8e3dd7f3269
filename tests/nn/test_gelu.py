"""fastops.nn.GELU / BiasGELU / LinearGELU: parity with the torch modules, shared Parameters, checkpoints."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fastops
from tests.helpers import devices

FORMS = pytest.mark.parametrize("approximate", ["none", "tanh"])


@devices
@FORMS
def test_gelu_module_matches_torch(device: str, approximate: str) -> None:
    ref = nn.GELU(approximate=approximate)
    m = fastops.nn.GELU.from_torch(ref)
    assert m.approximate == approximate and f"approximate='{approximate}'" in repr(m)
    x = torch.randn(5, 7, device=device, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    m(x).sum().backward()
    ref(x_ref).sum().backward()
    torch.testing.assert_close(m(x), ref(x_ref))
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_module_argument_errors() -> None:
    with pytest.raises(ValueError, match=r"fastops\.nn\.GELU: expected approximate"):
        fastops.nn.GELU("fast")
    with pytest.raises(TypeError, match=r"GELU\.from_torch: expected a torch\.nn\.GELU"):
        fastops.nn.GELU.from_torch(nn.ReLU())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"fastops\.nn\.BiasGELU: expected features"):
        fastops.nn.BiasGELU(0)
    with pytest.raises(TypeError, match=r"LinearGELU\.from_torch: expected a torch\.nn\.Linear"):
        fastops.nn.LinearGELU.from_torch(nn.GELU(), nn.GELU())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"fastops\.nn\.LinearGELU: expected approximate"):
        fastops.nn.LinearGELU(3, 4, approximate="erf")


@devices
@FORMS
def test_bias_gelu_module(device: str, approximate: str) -> None:
    m = fastops.nn.BiasGELU(6, approximate=approximate, device=device)
    assert m.bias.shape == (6,) and torch.count_nonzero(m.bias) == 0
    with torch.no_grad():
        m.bias.normal_()
    x = torch.randn(2, 3, 6, device=device, requires_grad=True)
    y = m(x)
    torch.testing.assert_close(y, F.gelu(x + m.bias, approximate=approximate))
    y.sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    b2 = m.bias.detach().clone().requires_grad_(True)
    F.gelu(x2 + b2, approximate=approximate).sum().backward()
    torch.testing.assert_close(m.bias.grad, b2.grad)
    torch.testing.assert_close(x.grad, x2.grad)


@devices
@FORMS
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gelu_matches_sequential(device: str, approximate: str, bias: bool) -> None:
    seq = nn.Sequential(nn.Linear(12, 20, bias=bias), nn.GELU(approximate=approximate)).to(device)
    m = fastops.nn.LinearGELU.from_torch(seq[0], seq[1])
    assert m.weight is seq[0].weight and m.bias is seq[0].bias  # the same Parameter objects
    assert m.approximate == approximate
    x = torch.randn(3, 4, 12, device=device)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y_ref = seq(x1)
    y_ref.sum().backward()
    ref_grads = [p.grad.clone() for p in seq.parameters()]
    seq.zero_grad()
    y = m(x2)
    y.sum().backward()
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x2.grad, x1.grad)
    for got, want in zip((p.grad for p in m.parameters()), ref_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_linear_gelu_parameters_like_linear() -> None:
    torch.manual_seed(3)
    m = fastops.nn.LinearGELU(7, 5, approximate="tanh")
    torch.manual_seed(3)
    lin = nn.Linear(7, 5)
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    torch.testing.assert_close(m.weight, lin.weight)  # nn.Linear's initialisation, same RNG draws
    torch.testing.assert_close(m.bias, lin.bias)
    assert "in_features=7, out_features=5, bias=True, approximate='tanh'" in repr(m)
    assert fastops.nn.LinearGELU(7, 5, bias=False).bias is None


def test_checkpoint_interchange_with_sequential() -> None:
    seq = nn.Sequential(nn.Linear(8, 16), nn.GELU())
    x = torch.randn(4, 8)
    # Sequential(Linear, GELU) checkpoint (keys "0.weight", "0.bias") -> LinearGELU
    m = fastops.nn.LinearGELU(8, 16)
    m.load_state_dict(seq.state_dict())
    torch.testing.assert_close(m(x), seq(x))
    # the Linear's own checkpoint (keys "weight", "bias") -> LinearGELU
    m2 = fastops.nn.LinearGELU(8, 16)
    m2.load_state_dict(seq[0].state_dict())
    torch.testing.assert_close(m2(x), seq(x))
    # LinearGELU -> Linear inside a fresh Sequential
    seq2 = nn.Sequential(nn.Linear(8, 16), nn.GELU())
    seq2[0].load_state_dict(m.state_dict())
    torch.testing.assert_close(seq2(x), m(x))
    # nested: a parent module's keys keep their prefix
    parent = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.GELU()))
    fused_parent = nn.Sequential(fastops.nn.LinearGELU(8, 16))
    fused_parent.load_state_dict(parent.state_dict())
    torch.testing.assert_close(fused_parent(x), parent(x))
    with pytest.raises(RuntimeError, match="size mismatch"):
        fastops.nn.LinearGELU(8, 17).load_state_dict(seq.state_dict())


@devices
def test_linear_gelu_autocast(device: str) -> None:
    half = torch.bfloat16 if device == "cpu" else torch.float16
    seq = nn.Sequential(nn.Linear(16, 32), nn.GELU()).to(device)
    m = fastops.nn.LinearGELU.from_torch(seq[0], seq[1])
    x = torch.randn(8, 16, device=device)
    with torch.autocast(device_type=device, dtype=half):
        y = m(x)
        y_ref = seq(x)
    assert y.dtype == y_ref.dtype == half
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    assert m.bias.grad is not None and m.bias.grad.dtype == torch.float32
