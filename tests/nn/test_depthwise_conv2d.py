"""fastops.nn.DepthwiseConv2d: parity with nn.Conv2d(groups=C), checkpoints both ways, the backend
choice, and what from_torch refuses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fastops
from tests.helpers import assert_close_to_reference, devices


@devices
def test_module_parity_and_checkpoints(device: str) -> None:
    torch_conv = nn.Conv2d(12, 12, 5, stride=2, padding=2, groups=12, device=device)
    ours = fastops.nn.DepthwiseConv2d.from_torch(torch_conv)
    assert ours.weight is torch_conv.weight and ours.bias is torch_conv.bias
    x = torch.randn(3, 12, 17, 16, device=device)
    torch.testing.assert_close(ours(x), torch_conv(x))

    fresh = fastops.nn.DepthwiseConv2d(12, 5, stride=2, padding=2, device=device)
    assert fresh.state_dict().keys() == torch_conv.state_dict().keys()
    fresh.load_state_dict(torch_conv.state_dict())
    torch.testing.assert_close(fresh(x), torch_conv(x))
    back = nn.Conv2d(12, 12, 5, stride=2, padding=2, groups=12, device=device)
    back.load_state_dict(fresh.state_dict())
    torch.testing.assert_close(back(x), fresh(x))
    assert "kernel_size=(5, 5)" in repr(fresh)

    nb = nn.Conv2d(4, 4, 3, padding="same", groups=4, bias=False, device=device)
    m = fastops.nn.DepthwiseConv2d.from_torch(nb)
    assert m.bias is None
    xs = torch.randn(1, 4, 6, 6, device=device).contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(m(xs), nb(xs))


@devices
def test_module_backend_choice(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One knob on every device: "torch" runs F.conv2d (bit for bit), "fastops" ours; a bad value is
    an error that names it."""
    conv = nn.Conv2d(8, 8, 3, padding=1, groups=8, device=device)
    m = fastops.nn.DepthwiseConv2d.from_torch(conv)
    x = torch.randn(2, 8, 9, 10, device=device).contiguous(memory_format=torch.channels_last)
    ref = fastops.reference.depthwise_conv2d(x.double(), conv.weight.double(), conv.bias.double(), 1, 1, 1)
    m.backend = "torch"
    assert torch.equal(m(x), F.conv2d(x, conv.weight, conv.bias, 1, 1, 1, 8))
    m.backend = "fastops"
    monkeypatch.setenv("FASTOPS_BACKEND", "torch")  # a module's own backend comes first
    assert_close_to_reference(m(x), ref)
    m.backend = "cublas"
    with pytest.raises(ValueError, match="expected backend to be one of .*'cublas'"):
        m(x)


def test_module_rejects_non_depthwise() -> None:
    with pytest.raises(ValueError, match=r"from_torch: expected a depthwise conv"):
        fastops.nn.DepthwiseConv2d.from_torch(nn.Conv2d(4, 8, 3, groups=4))
    with pytest.raises(ValueError, match=r"padding_mode='zeros'"):
        fastops.nn.DepthwiseConv2d.from_torch(nn.Conv2d(4, 4, 3, groups=4, padding_mode="reflect"))
    with pytest.raises(TypeError, match=r"expected an nn\.Conv2d"):
        fastops.nn.DepthwiseConv2d.from_torch(nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"'same' is not supported for strided"):
        fastops.nn.DepthwiseConv2d(4, 3, stride=2, padding="same")


@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize("backend", ["auto", "fastops"])
def test_unbatched_input_as_nn_conv2d(kernel: int, backend: str) -> None:
    """(C, H, W) input, which nn.Conv2d takes (16 of module_db's samples): the same output and
    gradients. With a 5x5 kernel in fp32 the policy failed first, reading shape[3]."""
    from fastops.nn.depthwise_conv2d import tf_same_padding

    torch.manual_seed(0)
    stock = nn.Conv2d(6, 6, kernel, stride=2, padding=kernel // 2, groups=6)
    w, b = stock.weight, stock.bias

    def tf_same(x: torch.Tensor) -> torch.Tensor:  # timm's Conv2dSame, on unbatched x as well
        top, bottom, left, right = tf_same_padding(x.shape[-2:], (kernel, kernel), (2, 2), (1, 1))
        return F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, 2, 0, 1, 6)

    same = fastops.nn.DepthwiseConv2dSame.from_torch(stock)
    for ours, reference in ((fastops.nn.DepthwiseConv2d.from_torch(stock), stock), (same, tf_same)):
        ours.backend = backend
        x = torch.randn(6, 11, 10, requires_grad=True)
        want, got = reference(x), ours(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(
            torch.autograd.grad(got.square().sum(), x), torch.autograd.grad(want.square().sum(), x)
        )
