"""The ops' typed errors (fastops/ops/_validate.py: ShapeError, DtypeError, ArgumentError), raised by
the C++ checks (csrc/include/fastops/checks.h, csrc/errors.cpp) on every way a call reaches them."""

from __future__ import annotations

import pytest
import torch

import fastops
from fastops.ops._validate import ArgumentError, DtypeError, ShapeError


def test_each_type_is_what_python_and_pytorch_code_catch() -> None:
    assert issubclass(ShapeError, ValueError) and issubclass(ShapeError, RuntimeError)
    assert issubclass(DtypeError, TypeError) and issubclass(DtypeError, NotImplementedError)
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, RuntimeError)


def test_a_direct_op_call_raises_the_typed_error() -> None:
    ops = torch.ops.fastops
    with pytest.raises(
        DtypeError, match=r"^fastops\.gelu: expected x to be a float32, .* got torch\.int64 on cpu"
    ):
        ops.gelu.default(torch.ones(3, dtype=torch.long), "none")
    with pytest.raises(ShapeError, match=r"^fastops\.bias_gelu: expected bias to be 1-D"):
        ops.bias_gelu.default(torch.ones(2, 3), torch.ones(2), "none")
    with pytest.raises(
        ArgumentError, match=r"^fastops\.clipped_log: expected eps to be a finite number > 0, got 0\.0$"
    ):
        ops.clipped_log.default(torch.ones(3), 0.0, True)
    with pytest.raises(
        ArgumentError, match=r"^fastops\.gelu: expected approximate to be 'none' or 'tanh', got 'erf'$"
    ):
        ops.gelu.default(torch.ones(3), "erf")


def test_values_are_written_as_python_writes_them() -> None:
    """Numbers in the C++ messages read as Python's repr: the Python functions raised these before."""
    for eps, written in ((1e39, "1e+39"), (1e-46, "1e-46"), (-0.0, "-0.0"), (-1e-06, "-1e-06")):
        with pytest.raises(ArgumentError) as error:
            torch.ops.fastops.clipped_log.default(torch.ones(3), eps, True)
        assert f"got {written}" in str(error.value) or f"eps={written} " in str(error.value), str(error.value)
    with pytest.raises(ArgumentError, match=r"expected 1\.4e-45 <= eps <= 3\.4e\+38$"):
        torch.ops.fastops.clipped_log.default(torch.ones(3), 1e39, True)
    with pytest.raises(ArgumentError, match=r"got -123\.5$"):
        torch.ops.fastops.batch_norm.default(torch.ones(4, 3), None, None, None, None, True, -123.5)


class _BackwardCallsAnOp(torch.autograd.Function):
    """A backward that calls a raw backward op with a grad_out of the wrong shape (the engine runs it)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return torch.ops.fastops.gelu_backward.default(grad[:1], grad, "none")


def test_the_type_survives_autograd_and_python_kernels() -> None:
    # Raised inside autograd's engine, by an op that a Python backward calls.
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(
        ShapeError, match=r"^fastops\.gelu_backward: expected grad_out to have the shape of x"
    ):
        _BackwardCallsAnOp.apply(x).sum().backward()
    # Through an autocast kernel (clipped_log's) and an Autograd kernel (depthwise_separable_conv2d's).
    ops = torch.ops.fastops
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ArgumentError, match="expected eps"):
        ops.clipped_log.default(torch.ones(3), -1.0, True)
    x = torch.randn(1, 4, 5, 5, requires_grad=True)
    with pytest.raises(ShapeError, match=r"expected pw_weight of shape \(Cout, 4, 1, 1\)"):
        ops.depthwise_separable_conv2d.default(
            x, torch.randn(4, 1, 3, 3), None, torch.randn(8, 3, 1, 1), None, [1, 1], [0] * 4, [1, 1]
        )


def test_a_compiled_call_raises_what_an_eager_call_raises() -> None:
    """The fake kernels check only what they need to shape outputs; the rest is raised by the kernel
    the compiled graph runs, so its type is the eager call's (an error raised while dynamo traces
    reaches the caller as its TorchRuntimeError instead)."""
    x, w = torch.randn(2, 4, 6, 6), torch.randn(4, 1, 3, 3)
    cases = [
        (fastops.gelu, (torch.ones(3, dtype=torch.long),), DtypeError),
        (fastops.depthwise_conv2d, (x, torch.randn(8, 1, 3, 3)), ShapeError),
        (fastops.depthwise_conv2d, (x, w.double()), DtypeError),
        (fastops.bias_gelu, (torch.ones(2, 3), torch.ones(2)), ShapeError),
    ]
    for fn, args, error in cases:
        with pytest.raises(error) as eager:
            fn(*args)
        torch._dynamo.reset()
        with pytest.raises(error) as compiled:
            torch.compile(fn, fullgraph=True)(*args)
        assert str(compiled.value) == str(eager.value)
