"""What the Python faces of the ops check, and the types of the errors the ops raise.

The C++ op checks its tensors and the hyper-parameters it receives (csrc/include/fastops/checks.h:
the one source of the error text). A Python function checks only what the op's schema cannot take
with a good message (a non-Tensor argument, a non-number eps) and parses hyper-parameters that must
be resolved before the call (an int or a pair of ints, padding="same"); a fake kernel checks what
shape inference needs; an ``nn`` constructor checks its own hyper-parameters with the helpers here.
Every helper that more than one op uses lives here; no op imports another op's private names."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

from fastops import _extension


# The errors for inputs the kernels cannot take, typed so that code written against PyTorch's own
# ops still catches them: aten raises RuntimeError for a shape it cannot take (a wrong channel count,
# a 5-D input to conv2d) and NotImplementedError (a RuntimeError) for a dtype it has no kernel for.
# Each is also the ValueError / TypeError a Python API raises for such an argument. The C++ checks
# raise them (csrc/errors.cpp), once registered below.
class ShapeError(ValueError, RuntimeError):
    """An input of a shape the op does not take (a ValueError and, as in PyTorch, a RuntimeError)."""


class DtypeError(TypeError, NotImplementedError):
    """An input of a dtype the op does not take (a TypeError and, as in PyTorch, a
    NotImplementedError, which is a RuntimeError)."""


class ArgumentError(ValueError, RuntimeError):
    """An argument value the op does not take: an eps that is not a finite number > 0, an unknown
    approximate, too few values per channel to train on (a ValueError, as the Python functions
    raised it, and a RuntimeError, as a direct ``torch.ops.fastops`` call raised it)."""


_library = _extension.load().module
assert _library is not None, "fastops._extension.load() returns the library it loaded"
_library._register_error_types(ShapeError, DtypeError, ArgumentError)


def under_torch_func() -> bool:
    """Whether a ``torch.func`` transform (grad, vjp, jacrev, vmap, functional_call under them) runs
    this call. The ops' autograd is C++ (a torch::autograd::Function: no Python on an eager call's
    way), which functorch cannot transform, and they have no batching rules; under a transform each
    op computes its plain-PyTorch definition (``fastops.reference``) instead, which functorch
    differentiates and batches as it does stock PyTorch. The C flag first: 50 ns on an eager call.
    Then is_compiling, since the flag reads True while dynamo traces (the traced graph then keeps
    our op, whose fake kernel it needs)."""
    return torch._C._are_functorch_transforms_active() and not torch.compiler.is_compiling()


def check_tensor(op: str, arg: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"fastops.{op}: expected {arg} to be a torch.Tensor, got {type(value).__name__}")
    return value


def check_real(op: str, arg: str, value: object) -> float:
    """A real number (not a bool) as a float: what a schema's ``float`` argument cannot refuse with a
    good message. Its range is the op's to check."""
    if type(value) is float:  # the common case, before the ABC check (~0.2 us)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"fastops.{op}: expected {arg} to be a real number, got {type(value).__name__}")
    return float(value)


def check_positive_float(op: str, arg: str, value: object) -> float:
    """A finite float > 0: for an ``nn`` constructor's own hyper-parameter (the op checks its own)."""
    number = check_real(op, arg, value)
    if not math.isfinite(number) or number <= 0.0:
        raise ValueError(f"fastops.{op}: expected {arg} to be a finite number > 0, got {number}")
    return number


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the kernels compute in for x (and hold scalars and per-channel results in):
    float64 for float64 x, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# ---- shared by the convolution ops ---------------------------------------------------------------

IntPair = int | Sequence[int]


def int_pair(op: str, arg: str, value: object, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints (not bools), each >= minimum, as an (h, w) pair."""
    if isinstance(value, bool):
        raise TypeError(f"fastops.{op}: expected {arg} to be an int or a pair of ints, got bool")
    if isinstance(value, numbers.Integral):
        pair = (int(value), int(value))
    elif (
        isinstance(value, Sequence)
        and len(value) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value)
    ):
        pair = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"fastops.{op}: expected {arg} to be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"fastops.{op}: expected {arg} to be >= {minimum}, got {value!r}")
    return pair


def kernel_hw(weight: torch.Tensor) -> tuple[int, int]:
    """(kh, kw) of a conv weight, for resolving padding="same": its last two sizes. A weight of
    another shape gives some padding, and the op then names the weight's shape as what is wrong."""
    if weight.dim() < 2:
        return (1, 1)
    return (int(weight.shape[-2]), int(weight.shape[-1]))


def resolve_padding(
    op: str,
    padding: IntPair | str,
    kernel_size: tuple[int, int],
    stride: tuple[int, int],
    dilation: tuple[int, int],
) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) for an int, a pair, "valid", "same" (F.conv2d's rules: "same"
    needs stride 1 and puts the odd extra zero at the bottom/right) or four ints (top, bottom, left,
    right), the asymmetric padding the kernels take (TensorFlow "same" with a stride needs it)."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding == "same":
            if stride != (1, 1):
                raise ValueError(f"fastops.{op}: padding='same' is not supported for strided convolutions")
            total_h = dilation[0] * (kernel_size[0] - 1)
            total_w = dilation[1] * (kernel_size[1] - 1)
            return (total_h // 2, total_h - total_h // 2, total_w // 2, total_w - total_w // 2)
        raise ValueError(
            f"fastops.{op}: expected padding to be an int, a pair, 'same' or 'valid', got {padding!r}"
        )
    if isinstance(padding, Sequence) and not isinstance(padding, str) and len(padding) == 4:
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0 for v in padding):
            raise ValueError(
                f"fastops.{op}: expected padding of 4 to be ints >= 0 (top, bottom, left, right), got {padding!r}"
            )
        top, bottom, left, right = (int(v) for v in padding)
        return (top, bottom, left, right)
    ph, pw = int_pair(op, "padding", padding, 0)
    return (ph, ph, pw, pw)


def conv_out_hw(
    op: str,
    h: int,
    w: int,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> tuple[int, int]:
    """Output height and width of a convolution with (top, bottom, left, right) padding; symbolic
    sizes welcome (used by fake kernels; the C++ twin is make_depthwise_geometry in
    csrc/include/fastops/depthwise.h, with the same message)."""
    span_h = dilation[0] * (kernel_size[0] - 1) + 1
    span_w = dilation[1] * (kernel_size[1] - 1) + 1
    hp, wp = h + padding[0] + padding[1], w + padding[2] + padding[3]
    # A plain raise, not torch._check: this runs inside torch.compile's trace of the public
    # function, and torch 2.11's dynamo cannot read a torch._check message that names local
    # variables (a graph break, an error under fullgraph; seen on the H200 run of 2026-11-27).
    if not (hp >= span_h and wp >= span_w):
        raise RuntimeError(
            f"fastops.{op}: the padded input ({hp} x {wp}) is smaller than the dilated kernel "
            f"({span_h} x {span_w})"
        )
    return (hp - span_h) // stride[0] + 1, (wp - span_w) // stride[1] + 1


def uses_channels_last(x: torch.Tensor) -> bool:
    """The layout rule of the 4-D C++ kernels (fastops/checks.h: use_channels_last): a 4-D
    tensor that is channels_last and not also contiguous runs the NHWC kernels."""
    return x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def check_same_device(op: str, x: torch.Tensor, x_arg: str = "x", **others: torch.Tensor | None) -> None:
    """For the fake kernels: a call whose tensors are on different devices, one of them "meta",
    reaches the fake kernel (the op's Meta kernel) instead of the device kernel that would refuse it.
    The C++ twin is check_same_device in csrc/include/fastops/checks.h, with the same message."""
    for arg, t in others.items():
        if t is not None and t.device != x.device:
            raise RuntimeError(
                f"fastops.{op}: expected {arg} on the same device as {x_arg} ({x.device}), got {t.device}"
            )


# ---- shared by the GELU ops ------------------------------------------------------------------------

GELU_APPROXIMATIONS = ("none", "tanh")


def check_approximate(op: str, approximate: object) -> str:
    if not isinstance(approximate, str) or approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"fastops.{op}: expected approximate to be 'none' or 'tanh', got {approximate!r}")
    return approximate
