"""fastops.nn.GELU, BiasGELU and LinearGELU: the module faces of fastops.gelu and fastops.bias_gelu."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fastops.nn._twin import accept_state_dict_keys, share_parameters
from fastops.ops._validate import check_approximate
from fastops.ops.gelu import bias_gelu, gelu
from fastops.swap import PairRule, SwapRule, register_swap_rule


class GELU(nn.Module):
    """Drop-in for ``torch.nn.GELU``: ``y = gelu(x, approximate)``; see :func:`fastops.gelu`."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = check_approximate("nn.GELU", approximate)

    @classmethod
    def from_torch(cls, m: nn.GELU) -> GELU:
        """A fastops GELU with the same ``approximate`` as ``m``."""
        if not isinstance(m, nn.GELU):
            raise TypeError(f"fastops.nn.GELU.from_torch: expected a torch.nn.GELU, got {type(m).__name__}")
        return cls(m.approximate)

    def forward(self, x: Tensor) -> Tensor:
        return gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class BiasGELU(nn.Module):
    """``y = gelu(x + bias)`` over the last dimension of x, with a learnable ``bias`` of ``features``
    elements (initialised to zero); see :func:`fastops.bias_gelu`."""

    def __init__(
        self,
        features: int,
        approximate: str = "none",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise ValueError(f"fastops.nn.BiasGELU: expected features to be an int >= 1, got {features!r}")
        self.features = features
        self.approximate = check_approximate("nn.BiasGELU", approximate)
        self.bias = nn.Parameter(torch.zeros(features, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return bias_gelu(x, self.bias.to(x.dtype), self.approximate)

    def extra_repr(self) -> str:
        return f"features={self.features}, approximate={self.approximate!r}"


class LinearGELU(nn.Module):
    """``gelu(x @ weight.T + bias)``: a Linear without its bias add, followed by the fused bias+GELU.

    ``weight`` (out_features, in_features) and ``bias`` (out_features) are named, shaped and
    initialised as in ``torch.nn.Linear``, so ``state_dict`` keys match a Linear's. A checkpoint of
    ``nn.Sequential(nn.Linear, nn.GELU)`` (keys ``0.weight`` / ``0.bias``) also loads directly.
    Under autocast the matmul runs in the autocast dtype and the bias is cast to it, as
    ``F.linear`` does; the fused kernel then runs in that dtype.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        approximate: str = "none",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.approximate = check_approximate("nn.LinearGELU", approximate)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        if bias:
            self.bias: nn.Parameter | None = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        # nn.Sequential(nn.Linear, nn.GELU) checkpoints: "<prefix>0.weight" -> "<prefix>weight".
        accept_state_dict_keys(self, {"0.": ""})

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1]
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_torch(cls, linear: nn.Linear, gelu_module: nn.GELU) -> LinearGELU:
        """A LinearGELU holding ``linear``'s own Parameter objects (no copy) and ``gelu_module``'s form."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"fastops.nn.LinearGELU.from_torch: expected a torch.nn.Linear, got {type(linear).__name__}"
            )
        if not isinstance(gelu_module, (nn.GELU, GELU)):
            raise TypeError(
                f"fastops.nn.LinearGELU.from_torch: expected a torch.nn.GELU, got {type(gelu_module).__name__}"
            )
        m = cls(
            linear.in_features,
            linear.out_features,
            linear.bias is not None,
            gelu_module.approximate,
            device="meta",
        )
        share_parameters(m, linear)
        return m

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight)
        if self.bias is None:
            return gelu(y, self.approximate)
        return bias_gelu(y, self.bias.to(y.dtype), self.approximate)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, approximate={self.approximate!r}"
        )


register_swap_rule(SwapRule("gelu", matches=lambda m: type(m) is nn.GELU, replace=GELU.from_torch))
register_swap_rule(
    PairRule(
        "linear_gelu",
        matches=lambda first, second: type(first) is nn.Linear and type(second) is nn.GELU,
        replace=LinearGELU.from_torch,
    )
)
