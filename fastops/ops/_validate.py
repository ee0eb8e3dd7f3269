"""Argument checks shared by the Python faces of the ops (run before dispatch and in fake kernels,
so eager, torch.compile and the C++ kernels reject the same inputs with the same words). Every helper
that more than one op uses lives here; no op imports another op's private names."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

from fastops import _extension

FLOATING_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# The errors for inputs the kernels cannot take, typed so that code written against PyTorch's own
# ops still catches them: aten raises RuntimeError for a shape it cannot take (a wrong channel count,
# a 5-D input to conv2d) and NotImplementedError (a RuntimeError) for a dtype it has no kernel for.
# Each is also the ValueError / TypeError a Python API raises for such an argument.
class ShapeError(ValueError, RuntimeError):
    """An input of a shape the op does not take (a ValueError and, as in PyTorch, a RuntimeError)."""


class DtypeError(TypeError, NotImplementedError):
    """An input of a dtype the op does not take (a TypeError and, as in PyTorch, a
    NotImplementedError, which is a RuntimeError)."""


class ArgumentError(ValueError, RuntimeError):
    """An argument value the op does not take: an eps that is not a finite number > 0, an unknown
    approximate, too few values per channel to train on (a ValueError, as the Python functions
    raised it, and a RuntimeError, as a direct ``torch.ops.fastops`` call raised it)."""


# The C++ checks raise these (csrc/errors.cpp), once registered.
_library = _extension.load().module
assert _library is not None, "fastops._extension.load() returns the library it loaded"
_library._register_error_types(ShapeError, DtypeError, ArgumentError)


def autocast_will_cast(x: object) -> bool:
    """Whether autocast is on for x's device. An op with an autocast kernel (csrc/depthwise_conv2d_op.cpp) then
    casts its tensors to the autocast dtype before any kernel or fake kernel sees them, so the eager
    check before dispatch must not yet ask their dtypes to agree (a bf16 activation meets fp32
    weights in every autocast model). Only CPU and CUDA have such kernels; torch.is_autocast_enabled
    raises for a device type without autocast (meta: shape-only calls, meta-device init)."""
    return (
        isinstance(x, torch.Tensor)
        and x.device.type in ("cpu", "cuda")
        and torch.is_autocast_enabled(x.device.type)
    )


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


def check_floating(op: str, arg: str, t: torch.Tensor) -> None:
    ok = t.dtype in FLOATING_DTYPES or (t.dtype == torch.float64 and t.device.type == "cpu")
    if not ok:
        extra = " (or float64 on the CPU)" if t.device.type == "cpu" else ""
        raise DtypeError(
            f"fastops.{op}: expected {arg} to be a float32, float16 or bfloat16 tensor{extra}, "
            f"got {t.dtype} on {t.device}"
        )


def check_positive_float(op: str, arg: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"fastops.{op}: expected {arg} to be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"fastops.{op}: expected {arg} to be a finite number > 0, got {value}")
    return value


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the kernels compute in for x (and hold scalars and per-channel results in):
    float64 for float64 x, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def check_positive_fits_compute_type(op: str, arg: str, value: object, x: torch.Tensor) -> float:
    """A finite float > 0 that stays so in x's compute dtype (fastops/checks.h has the C++ twin):
    eps=1e39 would be +inf in float32 and 1e-46 would be 0."""
    number = check_positive_float(op, arg, value)
    compute = compute_dtype(x)
    info = torch.finfo(compute)
    lo = info.smallest_normal * info.eps
    if number > info.max or number < lo:
        raise ValueError(
            f"fastops.{op}: {arg}={number!r} does not fit {compute} (the type {op} computes in for {x.dtype} "
            f"input): expected {lo:.3g} <= {arg} <= {info.max:.3g}"
        )
    return number


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
    sizes welcome (used by fake kernels)."""
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


def check_same_device(op: str, x: torch.Tensor, **others: torch.Tensor | None) -> None:
    for arg, t in others.items():
        if t is not None and t.device != x.device:
            raise RuntimeError(
                f"fastops.{op}: expected {arg} on the same device as x ({x.device}), got {t.device}"
            )


# ---- shared by the GELU ops ------------------------------------------------------------------------

GELU_APPROXIMATIONS = ("none", "tanh")


def check_approximate(op: str, approximate: object) -> str:
    if not isinstance(approximate, str) or approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"fastops.{op}: expected approximate to be 'none' or 'tanh', got {approximate!r}")
    return approximate
