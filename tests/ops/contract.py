"""The contract kit: one generic suite of checks, driven by an op's `OpSpec`.

An op's test file declares its spec and subclasses `ContractTests` with it; everything below then
runs from the spec alone (pytorch/extension-cpp's `sample_inputs` -> `_test_correctness` /
`_opcheck` is the model), and the file adds only the op's own edge cases::

    GELU = OpSpec(name="gelu", op=fastops.gelu, reference=reference.gelu, sample_inputs=...)

    class TestGeluContract(ContractTests):
        spec = GELU

The checks, each a test method parametrized from the spec:

- `test_reference` (every device and dtype): forward and every input gradient, for a fixed random
  upstream gradient, against the reference in float64 on the CPU. fp32/fp64 within assert_close's
  defaults (or the spec's fp32 tolerances); fp16/bf16 by the 2x rule (3x for gradients) against the
  spec's `eager` (PyTorch's own op; default: the reference) run in that dtype. Also the output's dtype,
  shape and memory format, and each gradient's dtype and shape. float64 runs on the CPU only (our
  CUDA kernels take fp32/fp16/bf16). A failure names every sample that failed and its worst element.
- `test_opcheck` (every device, `opcheck_dtypes`): `torch.library.opcheck` on the spec's
  (overload, args) pairs, backward ops included.
- `test_gradcheck`: float64 gradcheck (and gradgradcheck where the spec says so) on the CPU over
  `small_inputs`.
- `test_compile` (every device): `torch.compile(fullgraph=True)` of the op inside a small graph,
  forward and backward equal to eager.
- `test_autocast` (every device): under autocast the op runs in the dtype its policy names, gives
  what a plain call in that dtype gives, and hands each input a gradient of the input's own dtype.

A spec switches off what does not apply. An optimizer step that mutates its arguments and has no
autograd compares the tensors it mutated and runs opcheck, nothing else::

    FUSED_ADAM = OpSpec(
        name="fused_adam_",
        op=fused_adam,
        reference=reference.adam_step,
        sample_inputs=adam_samples,  # Sample((params, grads, ...), {"lr": 1e-2, ...}, id=...)
        opcheck_inputs=adam_opcheck_inputs,
        opcheck_utils=("test_schema", "test_faketensor"),
        mutates=True,
        differentiable=False,
        checks=("reference", "opcheck"),
    )
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from tests.helpers import HALF_DTYPES, assert_close_to_reference, cuda_only


@dataclass(frozen=True)
class Sample:
    """One call of an op: its positional and keyword arguments, and an id that names it in failures.
    The tensors that should receive a gradient require grad; views keep their layout (the kit
    detaches them, which keeps the strides)."""

    args: tuple
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    id: str = ""


# (device, dtype, requires_grad) -> samples made on that device in that dtype.
SampleFn = Callable[[str, torch.dtype, bool], Iterable[Sample]]
# (device, dtype) -> (overload, args) or (overload, args, kwargs) for torch.library.opcheck.
OpcheckFn = Callable[[str, torch.dtype], Iterable[tuple]]

CHECKS = ("reference", "opcheck", "gradcheck", "compile", "autocast")
ALL_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
OUTPUT_FORMATS = ("any", "preserve_format", "contiguous_format", "channels_last", "memory_format_of_input")


@dataclass(frozen=True)
class OpSpec:
    """What the kit needs to know about an op.

    name: the op, in test ids and messages.
    op: the public function. reference: `fastops.reference.X`, same signature.
    sample_inputs: every case `test_reference` checks (odd sizes, size-1 and empty dims,
        non-contiguous views, channels_last, every argument variant). It may choose by dtype.
    small_inputs: a few small samples: float64 gradcheck on the CPU and autocast run each of them.
    compile_inputs: what torch.compile runs (each sample is one compilation); default small_inputs.
    opcheck_inputs: the (overload, args[, kwargs]) pairs for opcheck, backward ops included.
    eager: PyTorch's own computation, run in fp16/bf16 as the yardstick of the 2x rule (default:
        the reference in that dtype).
    devices, dtypes: where and in what `test_reference` runs (float64 only on the CPU).
    autocast: the op's autocast policy. "input": runs in the dtype it receives (aten::gelu);
        "autocast": in the autocast dtype (aten::conv2d); a dtype: in that dtype (torch.float32,
        aten::log).
    output_format: what the op promises about its output's strides, checked on every sample, against
        the first tensor argument x: "preserve_format" (torch.empty_like(x)'s strides),
        "contiguous_format", "channels_last", "memory_format_of_input" (channels_last when x is
        channels_last and not also contiguous, else contiguous) or "any".
    fp32_tolerances: (rtol, atol) by output or gradient name ("output", "grad_bias", ...; "grad" for
        every gradient) where a float32 sum is long enough to need more than assert_close's defaults.
    output_factor, grad_factor: the 2x rule's factors.
    differentiable: False for an op without autograd (its samples are made without requires_grad).
    gradgradcheck: also check the double backward.
    mutates: the op writes into its arguments and returns nothing; those tensors are compared.
    opcheck_dtypes, opcheck_utils: opcheck's dtypes and its `test_utils` (default: all of them).
    checks: which of CHECKS run.
    """

    name: str
    op: Callable[..., Any]
    reference: Callable[..., Any]
    sample_inputs: SampleFn
    small_inputs: SampleFn | None = None
    compile_inputs: SampleFn | None = None
    opcheck_inputs: OpcheckFn | None = None
    eager: Callable[..., Any] | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    autocast: str | torch.dtype = "input"
    output_format: str = "any"
    fp32_tolerances: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    output_factor: float = 2.0
    grad_factor: float = 3.0
    differentiable: bool = True
    gradgradcheck: bool = False
    mutates: bool = False
    opcheck_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    opcheck_utils: tuple[str, ...] | None = None
    checks: Iterable[str] = CHECKS

    def __post_init__(self) -> None:
        unknown = set(self.checks) - set(CHECKS)
        assert not unknown, f"{self.name}: unknown checks {sorted(unknown)}"
        assert self.output_format in OUTPUT_FORMATS, f"{self.name}: output_format {self.output_format!r}"
        assert self.autocast in ("input", "autocast") or isinstance(self.autocast, torch.dtype)
        needs_small = {"gradcheck", "autocast"} | ({"compile"} if self.compile_inputs is None else set())
        assert self.small_inputs is not None or not needs_small & set(self.checks), (
            f"{self.name}: {sorted(needs_small & set(self.checks))} need small_inputs"
        )
        assert self.opcheck_inputs is not None or "opcheck" not in self.checks
        assert self.differentiable or not {"gradcheck", "compile", "autocast"} & set(self.checks), (
            f"{self.name}: gradcheck, compile and autocast take gradients; switch them off"
        )


# ---- tensors in nested arguments ---------------------------------------------------------------------


def _map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(fn, o) for o in obj)
    if isinstance(obj, Mapping):
        return {k: _map_tensors(fn, v) for k, v in obj.items()}
    return obj


def _named_tensors(
    op: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]
) -> list[tuple[str, torch.Tensor]]:
    """Every tensor argument of a call with the name of its parameter (`params[3]` inside a list)."""
    bound = inspect.signature(op).bind(*args, **kwargs)
    named = []
    for name, value in bound.arguments.items():
        if isinstance(value, torch.Tensor):
            named.append((name, value))
        elif isinstance(value, (list, tuple)):
            named += [(f"{name}[{i}]", t) for i, t in enumerate(value) if isinstance(t, torch.Tensor)]
    return named


def _fresh(
    spec: OpSpec, sample: Sample, convert: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> tuple[tuple, dict[str, Any]]:
    """The sample's arguments for one call: each tensor detached (which keeps a view's strides),
    converted, cloned if the op writes into it, and requiring grad as the sample's tensor did."""

    def fresh(t: torch.Tensor) -> torch.Tensor:
        d = t.detach()
        u = d if convert is None else convert(d)
        if spec.mutates and u is d:
            u = u.clone()
        return u.requires_grad_(t.requires_grad) if u.is_floating_point() else u

    return _map_tensors(fresh, sample.args), _map_tensors(fresh, dict(sample.kwargs))


def _to_float64_cpu(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu", torch.float64) if t.is_floating_point() else t.cpu()


def _upstream(out: torch.Tensor, i: int) -> torch.Tensor:
    """A fixed random upstream gradient, drawn in float64 and held in the output's dtype."""
    gen = torch.Generator().manual_seed(1 + i)
    return torch.randn(out.shape, dtype=torch.float64, generator=gen).to(out.dtype).to(out.device)


@dataclass
class _Run:
    outputs: list[tuple[str, torch.Tensor]]
    grads: list[tuple[str, torch.Tensor, torch.Tensor]]  # (name, gradient, the input it belongs to)
    upstream: list[torch.Tensor]


def _run(
    spec: OpSpec,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    upstream: list[torch.Tensor] | None = None,
) -> _Run:
    """fn(*args, **kwargs) (a mutating op's results are the tensors it wrote), and the gradient of
    every input that requires one for `upstream` (default: a fixed random one per output)."""
    result = fn(*args, **kwargs)
    inputs = _named_tensors(spec.op, args, kwargs)
    if spec.mutates:
        outputs = inputs
    else:
        results = [result] if isinstance(result, torch.Tensor) else list(result)
        outputs = [("output" if len(results) == 1 else f"output{i}", t) for i, t in enumerate(results)]
    if upstream is None:
        upstream = [_upstream(t, i) for i, (_, t) in enumerate(outputs)]
    leaves = [(name, t) for name, t in inputs if t.requires_grad]
    grads = []
    if leaves:
        live = [(t, g) for (_, t), g in zip(outputs, upstream, strict=True) if t.numel() and t.requires_grad]
        got = (
            torch.autograd.grad(
                [t for t, _ in live], [t for _, t in leaves], [g for _, g in live], allow_unused=True
            )
            if live
            else [None] * len(leaves)
        )
        grads = [
            (f"grad_{name}", torch.zeros_like(t) if g is None else g, t)
            for (name, t), g in zip(leaves, got, strict=True)
        ]
    return _Run([(n, t.detach()) for n, t in outputs], grads, upstream)


# ---- the checks --------------------------------------------------------------------------------------


def check_close(what: str, actual: torch.Tensor, reference64: torch.Tensor, **kwargs: Any) -> None:
    """assert_close_to_reference, with `what` in front of its message."""
    try:
        assert_close_to_reference(actual, reference64, **kwargs)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def _tolerance(spec: OpSpec, name: str, dtype: torch.dtype) -> dict[str, float]:
    if dtype != torch.float32:
        return {}
    kind = "grad" if name.startswith("grad_") else "output"
    tol = spec.fp32_tolerances.get(name, spec.fp32_tolerances.get(kind))
    return {} if tol is None else {"rtol": tol[0], "atol": tol[1]}


def _check_format(spec: OpSpec, x: torch.Tensor, y: torch.Tensor) -> None:
    fmt = spec.output_format
    if fmt == "preserve_format":
        want = torch.empty_like(x).stride()
        assert y.stride() == want, f"output strides {y.stride()}, expected {want} (input {x.stride()})"
        return
    if fmt == "memory_format_of_input":
        channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
        fmt = "channels_last" if channels_last and not x.is_contiguous() else "contiguous_format"
    if fmt == "contiguous_format":
        assert y.is_contiguous(), f"output strides {y.stride()}: expected contiguous"
    elif fmt == "channels_last":
        assert y.is_contiguous(memory_format=torch.channels_last), (
            f"output strides {y.stride()}: expected NHWC"
        )


def check_sample(spec: OpSpec, sample: Sample, dtype: torch.dtype) -> None:
    """The op on one sample (made in `dtype`) against the float64 reference: outputs, then gradients."""
    args, kwargs = _fresh(spec, sample)
    ours = _run(spec, spec.op, args, kwargs)
    ref = _run(
        spec,
        spec.reference,
        *_fresh(spec, sample, _to_float64_cpu),
        [g.double().cpu() for g in ours.upstream],
    )
    eager = None
    if dtype in HALF_DTYPES:
        eager = _run(spec, spec.eager or spec.reference, *_fresh(spec, sample), ours.upstream)
    if not spec.mutates:
        x = next(t for _, t in _named_tensors(spec.op, args, kwargs))
        for name, y in ours.outputs:
            assert y.dtype == dtype, f"{name}: dtype {y.dtype}, expected {dtype}"
        _check_format(spec, x, ours.outputs[0][1])
    for i, (name, y) in enumerate(ours.outputs):
        check_close(
            name,
            y,
            ref.outputs[i][1],
            eager=eager.outputs[i][1] if eager else None,
            factor=spec.output_factor,
            **_tolerance(spec, name, dtype),
        )
    for i, (name, g, t) in enumerate(ours.grads):
        assert g.dtype == t.dtype and g.shape == t.shape, (
            f"{name}: {g.dtype} {tuple(g.shape)} for {t.dtype} {tuple(t.shape)}"
        )
        check_close(
            name,
            g,
            ref.grads[i][1],
            eager=eager.grads[i][1] if eager else None,
            factor=spec.grad_factor,
            **_tolerance(spec, name, dtype),
        )


def _check_all(spec: OpSpec, samples: Iterable[Sample], check: Callable[[Sample], None]) -> None:
    """check(sample) for every sample; fail once at the end, naming every sample that failed."""
    failures, n = [], 0
    for sample in samples:
        n += 1
        try:
            check(sample)
        except Exception as e:  # a kernel's RuntimeError is as much a failure as a wrong value
            failures.append(f"[{sample.id}] {type(e).__name__}: {e}")
    assert n, f"{spec.name}: no samples"
    if failures:
        shown = "\n".join(failures[:10]) + (
            f"\n... and {len(failures) - 10} more" if len(failures) > 10 else ""
        )
        pytest.fail(f"{spec.name}: {len(failures)}/{n} samples failed:\n{shown}", pytrace=False)


def _replace(obj: Any, old: list[torch.Tensor], new: tuple[torch.Tensor, ...]) -> Any:
    where = {id(t): i for i, t in enumerate(old)}
    return _map_tensors(lambda t: new[where[id(t)]] if id(t) in where else t, obj)


def _as_function_of_leaves(spec: OpSpec, sample: Sample) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """The op as a function of the sample's tensors that require grad (gradcheck's and compile's form)."""
    args, kwargs = _fresh(spec, sample)
    leaves = [t for _, t in _named_tensors(spec.op, args, kwargs) if t.requires_grad]

    def fn(*tensors: torch.Tensor) -> Any:
        return spec.op(*_replace(args, leaves, tensors), **_replace(kwargs, leaves, tensors))

    return fn, leaves


def _outputs(result: Any) -> list[torch.Tensor]:
    return [result] if isinstance(result, torch.Tensor) else list(result)


def _grads_of(outs: list[torch.Tensor], leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    upstream = [_upstream(o, i) for i, o in enumerate(outs)]
    got = torch.autograd.grad(outs, leaves, upstream, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, got, strict=True)]


class ContractTests:
    """The generic suite; an op's test file subclasses it with `spec = <its OpSpec>`."""

    spec: OpSpec

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        # CUDA cases are collected and skipped without a GPU, as `devices` in tests/helpers.py does.
        spec = self.spec
        marks = {d: [cuda_only] if d == "cuda" else [] for d in spec.devices}
        if "dtype" in metafunc.fixturenames:
            dtypes = spec.opcheck_dtypes if metafunc.function.__name__ == "test_opcheck" else spec.dtypes
            pairs = [
                pytest.param(d, t, id=f"{d}-{str(t).removeprefix('torch.')}", marks=marks[d])
                for d in spec.devices
                for t in dtypes
                if t != torch.float64 or d == "cpu"
            ]
            metafunc.parametrize(("device", "dtype"), pairs)
        elif "device" in metafunc.fixturenames:
            metafunc.parametrize("device", [pytest.param(d, marks=marks[d]) for d in spec.devices])

    def _require(self, check: str) -> None:
        if check not in self.spec.checks:
            pytest.skip(f"{self.spec.name}: the spec switches {check} off")

    def test_reference(self, device: str, dtype: torch.dtype) -> None:
        self._require("reference")
        spec = self.spec
        samples = spec.sample_inputs(device, dtype, spec.differentiable)
        _check_all(spec, samples, lambda s: check_sample(spec, s, dtype))

    def test_opcheck(self, device: str, dtype: torch.dtype) -> None:
        self._require("opcheck")
        spec = self.spec
        assert spec.opcheck_inputs is not None
        kw = {} if spec.opcheck_utils is None else {"test_utils": spec.opcheck_utils}
        for overload, args, *kwargs in spec.opcheck_inputs(device, dtype):
            torch.library.opcheck(overload, args, *kwargs, **kw)

    def test_gradcheck(self) -> None:
        self._require("gradcheck")
        spec = self.spec
        assert spec.small_inputs is not None

        def check(sample: Sample) -> None:
            fn, leaves = _as_function_of_leaves(spec, sample)
            assert torch.autograd.gradcheck(fn, leaves)
            if spec.gradgradcheck:
                assert torch.autograd.gradgradcheck(fn, leaves)

        _check_all(spec, spec.small_inputs("cpu", torch.float64, True), check)

    def test_compile(self, device: str) -> None:
        self._require("compile")
        spec = self.spec
        make = spec.compile_inputs or spec.small_inputs
        assert make is not None

        def check(sample: Sample) -> None:
            op, leaves = _as_function_of_leaves(spec, sample)

            def f(*tensors: torch.Tensor) -> list[torch.Tensor]:
                # Pointwise ops around the op: inductor fuses them and reads our output with the strides
                # the fake kernel promised, so a fake that lies about them shows here.
                return [torch.sin(o) * 2 for o in _outputs(op(*tensors))]

            torch._dynamo.reset()  # each sample compiles afresh (the cache is per code object)
            got = torch.compile(f, fullgraph=True, dynamic=False)(*leaves)
            want = f(*leaves)
            torch.testing.assert_close(got, want)
            for a, b in zip(_grads_of(got, leaves), _grads_of(want, leaves), strict=True):
                torch.testing.assert_close(a, b)

        _check_all(spec, make(device, torch.float32, True), check)

    def test_autocast(self, device: str) -> None:
        self._require("autocast")
        spec = self.spec
        assert spec.small_inputs is not None
        half = torch.bfloat16 if device == "cpu" else torch.float16
        for in_dtype in (torch.float32, half):
            if spec.autocast == "input":
                want = in_dtype
            else:
                want = half if spec.autocast == "autocast" else spec.autocast

            def check(sample: Sample, want: torch.dtype = want) -> None:
                fn, leaves = _as_function_of_leaves(spec, sample)
                with torch.autocast(device_type=device, dtype=half):
                    outs = _outputs(fn(*leaves))
                for o in outs:
                    assert o.dtype == want, f"under autocast: {o.dtype}, the policy says {want}"
                # Autocast only casts: a plain call on inputs in that dtype gives the same numbers.
                plain = _outputs(fn(*(t.detach().to(want) for t in leaves)))
                torch.testing.assert_close(outs, plain)
                for g, t in zip(_grads_of(outs, leaves), leaves, strict=True):
                    assert g.dtype == t.dtype, f"gradient {g.dtype} for an input of {t.dtype}"

            _check_all(spec, spec.small_inputs(device, in_dtype, True), check)
