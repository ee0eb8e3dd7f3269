"""fastops.nn.DepthwiseSeparableConv2d: a depthwise conv then a 1x1 conv, running the fused
fastops.depthwise_separable_conv2d where it is faster; compatible with the nn.Conv2d pair."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fastops import policy
from fastops.nn._twin import accept_state_dict_keys
from fastops.nn.depthwise_conv2d import DepthwiseConv2d
from fastops.ops.depthwise_separable_conv2d import depthwise_separable_conv2d
from fastops.policy import runs_torch
from fastops.swap_rules import global_module_hooks

# nn.Sequential(depthwise, pointwise) saves "0.*" / "1.*": map them onto our submodule names.
_SEQUENTIAL_KEYS = {"0.": "depthwise.", "1.": "pointwise."}


class DepthwiseSeparableConv2d(policy.TunedModule):
    """``depthwise`` (fastops DepthwiseConv2d, k x k, groups=C) then ``pointwise`` (nn.Conv2d 1x1).

    State-dict keys are ``depthwise.weight``, ``depthwise.bias``, ``pointwise.weight`` and
    ``pointwise.bias`` with nn.Conv2d shapes; a state dict of ``nn.Sequential(depthwise_conv, conv1x1)``
    (keys ``0.*`` / ``1.*``) loads as well.

    Channels_last CPU input with no gradient to record (inference, ``torch.no_grad()``) can run the
    fused :func:`fastops.depthwise_separable_conv2d`: the depthwise output never goes to memory. Whether
    it does is this module's ``backend`` (:mod:`fastops.policy`): under ``"auto"`` the fused kernel
    runs where it is measured faster than the pair on this machine. When autograd records, the pair
    runs: the fused op's backward recomputes the depthwise output, and forward+backward is no faster
    than the pair. Any other input (NCHW; CUDA, which has no fused kernel) runs the pair: the
    depthwise module (with its own kernel choice), then the 1x1 through ATen (a GEMM on channels_last
    data): feed channels_last input for the fast path.
    """

    policy_ops = ("depthwise_separable_conv2d",)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | str = 0,
        dilation: int | Sequence[int] = 1,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.depthwise = DepthwiseConv2d(
            in_channels, kernel_size, stride, padding, dilation, bias, device=device, dtype=dtype
        )
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, bias=bias, device=device, dtype=dtype)
        accept_state_dict_keys(self, _SEQUENTIAL_KEYS)

    def fastops_details(self) -> str:
        return f"{self.depthwise.fastops_details()}, 1x1 to {self.pointwise.out_channels} channels"

    def forward(self, x: Tensor) -> Tensor:
        if _fusable(x, self.depthwise, self.pointwise) and not runs_torch(self, x):
            return self._fastops_forward(x)
        return self._torch_forward(x)

    def _fastops_forward(self, x: Tensor) -> Tensor:
        dw, pw = self.depthwise, self.pointwise
        return depthwise_separable_conv2d(
            x, dw.weight, dw.bias, pw.weight, pw.bias, dw.stride, dw.padding, dw.dilation
        )

    def _torch_forward(self, x: Tensor) -> Tensor:
        return self.pointwise(self.depthwise(x))

    @classmethod
    def from_torch(cls, module: nn.Module) -> DepthwiseSeparableConv2d:
        """From ``nn.Sequential(depthwise nn.Conv2d, 1x1 nn.Conv2d)`` or any module with ``depthwise``
        and ``pointwise`` nn.Conv2d children, sharing their Parameter objects."""
        dw: object
        pw: object
        if isinstance(module, nn.Sequential) and len(module) == 2:
            dw, pw = module[0], module[1]
        elif hasattr(module, "depthwise") and hasattr(module, "pointwise"):
            dw, pw = module.depthwise, module.pointwise
        else:
            raise TypeError(
                "fastops.nn.DepthwiseSeparableConv2d.from_torch: expected nn.Sequential(depthwise conv, 1x1 conv) "
                f"or a module with .depthwise and .pointwise, got {type(module).__name__}"
            )
        if not isinstance(pw, nn.Conv2d) or pw.kernel_size != (1, 1) or pw.groups != 1:
            raise ValueError(
                "fastops.nn.DepthwiseSeparableConv2d.from_torch: expected the pointwise conv to be a 1x1 nn.Conv2d"
            )
        if not isinstance(dw, (DepthwiseConv2d, nn.Conv2d)):
            raise TypeError(
                "fastops.nn.DepthwiseSeparableConv2d.from_torch: expected the depthwise conv to be an nn.Conv2d, "
                f"got {type(dw).__name__}"
            )
        depthwise = dw if isinstance(dw, DepthwiseConv2d) else DepthwiseConv2d.from_torch(dw)
        m = cls(pw.in_channels, pw.out_channels, depthwise.kernel_size, device="meta")
        m.depthwise = depthwise  # the same modules, holding the same Parameter objects
        m.pointwise = pw
        return m


def _fusable(x: Tensor, dw: nn.Module, pw: nn.Module) -> bool:
    """Whether the fused CPU kernel computes exactly what ``pw(dw(x))`` would: channels_last CPU input
    (the layout the kernel is fast in; fastops.depthwise_conv2d's rule for "channels_last"), a plain
    1x1 nn.Conv2d with nothing that its own forward or hooks (or global module hooks) would add; and only when no gradient is
    recorded (in training the recompute in the fused op's backward costs more than the fusion saves)."""
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or any(p.requires_grad for p in (*dw.parameters(), *pw.parameters()))
    )
    return (
        not needs_grad
        and isinstance(x, Tensor)
        and x.device.type == "cpu"
        and x.dim() == 4
        and not x.is_contiguous()
        and x.is_contiguous(memory_format=torch.channels_last)
        and type(dw) is DepthwiseConv2d
        and type(pw) is nn.Conv2d
        and pw.kernel_size == (1, 1)
        and pw.stride == (1, 1)
        and pw.dilation == (1, 1)
        and pw.groups == 1
        and pw.padding in ((0, 0), "valid")
        and pw.padding_mode == "zeros"
        and not (dw._forward_hooks or dw._forward_pre_hooks or pw._forward_hooks or pw._forward_pre_hooks)
        # Hooks registered for every module must see dw and pw run, as they would in the pair.
        and not global_module_hooks()
    )
