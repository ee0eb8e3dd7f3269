"""fastops.optim.FusedAdam / FusedAdamW against torch.optim.Adam / AdamW(foreach=False), on every device."""

from __future__ import annotations

import contextlib
import datetime
import io
import math
import os
import tempfile
from collections.abc import Callable, Iterator

import pytest
import torch

from fastops import reference
from fastops.ops.fused_adam import fused_adam
from fastops.optim import FusedAdam, FusedAdamW
from tests.helpers import (
    HALF_DTYPES,
    assert_close_to_reference,
    cuda_only,
    devices,
    dtypes,
    leave_spawned_worker,
    ulp_floor,
)

# 0-d, empty (also empty last), one spanning several CPU tasks (> 32768 elements), odd sizes.
SHAPES = [(7, 5), (), (0,), (300, 257), (3, 0, 2), (33,), (1, 17), (0,)]
STEPS = 8
PAIRS = {"adam": (torch.optim.Adam, FusedAdam), "adamw": (torch.optim.AdamW, FusedAdamW)}


def _params(
    device: str, dtype: torch.dtype = torch.float32, shapes=SHAPES, seed: int = 0
) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype) for s in shapes]


def _grads(params: list[torch.Tensor], step: int) -> list[torch.Tensor]:
    """Gradients independent of the params (so runs in different precisions see the same ones)."""
    gen = torch.Generator().manual_seed(1000 + step)
    return [
        torch.randn(p.shape, generator=gen, dtype=torch.float64).to(device=p.device, dtype=p.dtype)
        for p in params
    ]


def _leaves(tensors: list[torch.Tensor], dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    return [t.detach().clone().to(dtype or t.dtype).requires_grad_(True) for t in tensors]


def _groups(params: list[torch.Tensor], lr: float | torch.Tensor, **extra) -> list[dict]:
    """Two groups; the second overrides lr, betas and eps."""
    second_lr = lr * 0.5 if not isinstance(lr, torch.Tensor) else lr.clone() * 0.5
    return [
        {"params": params[:4], **extra},
        {"params": params[4:], "lr": second_lr, "betas": (0.8, 0.99), "eps": 1e-6, **extra},
    ]


def _run(opt: torch.optim.Optimizer, params: list[torch.Tensor], steps: int, start: int = 0) -> None:
    for k in range(start, start + steps):
        for p, g in zip(params, _grads(params, k), strict=True):
            p.grad = g.to(p.dtype)
        opt.step()


def _assert_state_equal(ours: torch.optim.Optimizer, theirs: torch.optim.Optimizer, **tol) -> None:
    for (p_ours, s_ours), (p_theirs, s_theirs) in zip(ours.state.items(), theirs.state.items(), strict=True):
        assert s_ours.keys() == s_theirs.keys()
        for key in s_ours:
            a, b = s_ours[key], s_theirs[key]
            assert a.shape == b.shape and a.dtype == b.dtype, key
            torch.testing.assert_close(a.cpu(), b.cpu(), msg=lambda m, key=key: f"state {key}: {m}", **tol)
        torch.testing.assert_close(p_ours, p_theirs, **tol)


@devices
@pytest.mark.parametrize("kind", ["adam", "adamw"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("amsgrad", [False, True], ids=["", "amsgrad"])
@pytest.mark.parametrize("maximize", [False, True], ids=["", "maximize"])
@pytest.mark.parametrize("tensor_lr", [False, True], ids=["float_lr", "tensor_lr"])
def test_matches_torch(
    device: str, kind: str, weight_decay: float, amsgrad: bool, maximize: bool, tensor_lr: bool
) -> None:
    torch_cls, fast_cls = PAIRS[kind]
    base = _params(device)
    lr = torch.tensor(1e-2) if tensor_lr else 1e-2
    kwargs = {"weight_decay": weight_decay, "amsgrad": amsgrad, "maximize": maximize}
    ours, theirs = _leaves(base), _leaves(base)
    opt = fast_cls(_groups(ours, lr), **kwargs)
    ref = torch_cls(_groups(theirs, lr), foreach=False, **kwargs)
    _run(opt, ours, STEPS)
    _run(ref, theirs, STEPS)
    _assert_state_equal(opt, ref)
    for p, p0 in zip(ours, base, strict=True):
        if p.numel():
            assert not torch.equal(p.detach(), p0), "a non-empty param was not updated"


@devices
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_empty_last_param_does_not_skip_the_others(device: str, kind: str) -> None:
    """apex/DeepSpeed-style multi-tensor loops could drop the pending chunk when the last tensor was
    empty; here every tensor before an empty last one must be updated exactly as torch does."""
    torch_cls, fast_cls = PAIRS[kind]
    shapes = [(4097,), (3,), (5, 5), (0,)] + [(2,)] * 5 + [(0,), (0, 3)]
    base = _params(device, shapes=shapes)
    ours, theirs = _leaves(base), _leaves(base)
    opt, ref = fast_cls(ours, lr=1e-2), torch_cls(theirs, lr=1e-2, foreach=False)
    _run(opt, ours, 3)
    _run(ref, theirs, 3)
    _assert_state_equal(opt, ref)
    assert all(float(opt.state[p]["step"]) == 3 for p in ours)


@devices
def test_many_tensors_and_huge_lists(device: str) -> None:
    """More tensors than one CUDA launch's argument table holds, empty ones sprinkled in."""
    shapes = [((i * 7) % 23,) if i % 9 else (0,) for i in range(1300)] + [(70000,), (0,)]
    base = _params(device, shapes=shapes)
    ours, theirs = _leaves(base), _leaves(base)
    opt, ref = FusedAdamW(ours, lr=1e-2), torch.optim.AdamW(theirs, lr=1e-2, foreach=False)
    _run(opt, ours, 2)
    _run(ref, theirs, 2)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


@devices
def test_layouts(device: str) -> None:
    """Transposed and channels_last params, a non-dense param (a strided view), and grads whose
    layout differs from their param's: all handled, with the state in the param's layout."""
    x = torch.randn(6, 10, device=device)
    params = [
        torch.randn(5, 7, device=device).t(),
        torch.randn(2, 3, 4, 5, device=device).contiguous(memory_format=torch.channels_last),
        x[:, ::2],
        torch.randn(4, 9, device=device),
    ]
    # Leaves with the layouts above; params[2] stays a non-dense view of x.
    ours = [p.detach().clone() if i != 2 else p.detach() for i, p in enumerate(params)]
    ours = [p.requires_grad_(True) for p in ours]
    assert not ours[2].is_contiguous() and ours[0].stride() == (1, 7)
    theirs = [p.detach().clone().requires_grad_(True) for p in ours]
    opt, ref = (
        FusedAdam(ours, lr=1e-2, weight_decay=0.1, amsgrad=True),
        torch.optim.Adam(theirs, lr=1e-2, weight_decay=0.1, amsgrad=True, foreach=False),
    )
    for k in range(3):
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            g = _grads([a.detach()], k)[0]
            if i == 3:
                g = g.t().contiguous().t()  # column-major grad for a row-major param
            a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    _assert_state_equal(opt, ref)
    assert opt.state[ours[0]]["exp_avg"].stride() == ours[0].stride()


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_float64_cpu(kind: str) -> None:
    torch_cls, fast_cls = PAIRS[kind]
    base = _params("cpu", torch.float64)
    ours, theirs = _leaves(base), _leaves(base)
    opt = fast_cls(ours, lr=1e-2, weight_decay=0.05, amsgrad=True)
    ref = torch_cls(theirs, lr=1e-2, weight_decay=0.05, amsgrad=True, foreach=False)
    _run(opt, ours, STEPS)
    _run(ref, theirs, STEPS)
    _assert_state_equal(opt, ref, rtol=1e-12, atol=1e-12)


@devices
def test_mixed_dtypes_in_one_group(device: str) -> None:
    base = _params(device)
    ours = _leaves(base[:4]) + _leaves(base[4:], torch.bfloat16)
    theirs = [p.detach().clone().requires_grad_(True) for p in ours]
    opt, ref = FusedAdamW(ours, lr=1e-2), torch.optim.AdamW(theirs, lr=1e-2, foreach=False)
    _run(opt, ours, 2)
    _run(ref, theirs, 2)
    for a, b in zip(ours[:4], theirs[:4], strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(ours[4:], theirs[4:], strict=True):
        assert a.dtype == torch.bfloat16 and opt.state[a]["exp_avg"].dtype == torch.bfloat16
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@devices
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["adam", "adamw"])
@pytest.mark.parametrize("amsgrad", [False, True], ids=["", "amsgrad"])
def test_half_precision_2x_rule(device: str, dtype: torch.dtype, kind: str, amsgrad: bool) -> None:
    """fp16/bf16 params and state: per tensor, our max error against a float64 run of the same
    steps is at most twice that of torch.optim in the same dtype (plus one ulp of the values)."""
    torch_cls, fast_cls = PAIRS[kind]
    base = [p * 0.1 for p in _params(device, dtype)]
    kwargs = {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": amsgrad, "eps": 1e-4}
    ours, theirs, exact = _leaves(base), _leaves(base), _leaves(base, torch.float64)
    opt, ref = fast_cls(ours, **kwargs), torch_cls(theirs, foreach=False, **kwargs)
    ref64 = torch_cls(exact, foreach=False, **kwargs)
    for k in range(STEPS):
        grads = _grads(ours, k)  # rounded to dtype once; the float64 run sees the same values
        for a, b, c, g in zip(ours, theirs, exact, grads, strict=True):
            a.grad, b.grad, c.grad = g.clone(), g.clone(), g.double()
        opt.step()
        ref.step()
        ref64.step()
    _assert_2x_rule((opt, ours), (ref, theirs), (ref64, exact))


Run = tuple[torch.optim.Optimizer, list[torch.Tensor]]


def _assert_2x_rule(ours: Run, theirs: Run, exact: Run) -> None:
    """fp16/bf16 runs, per tensor (the param and each moment): our max error against the float64 run
    `exact` is at most twice that of `theirs` (torch.optim in our dtype), plus one ulp of the values.
    Per tensor, not per element: over several steps the two roundings drift apart element by element."""
    (opt, ps), (ref, qs), (ref64, rs) = ours, theirs, exact
    for i, (a, b, c) in enumerate(zip(ps, qs, rs, strict=True)):
        if a.numel() == 0:
            continue
        moments = [n for n in opt.state[a] if n != "step"]
        trios = [("param", a, b, c)] + [
            (n, opt.state[a][n], ref.state[b][n], ref64.state[c][n]) for n in moments
        ]
        for name, x, y, z in trios:
            ours_err = (x.double() - z).abs().max().item()
            torch_err = (y.double() - z).abs().max().item()
            allowed = 2 * max(torch_err, ulp_floor(x.dtype) * z.abs().max().item()) + 1e-7
            assert ours_err <= allowed, (
                f"tensor {i} {name}: error {ours_err:.3e} > 2x torch's {torch_err:.3e}"
            )


def _functional_args(
    device: str, amsgrad: bool = False, dtype: torch.dtype = torch.float32, shapes=SHAPES
) -> tuple[list[list[torch.Tensor]], dict]:
    """The six lists of fused_adam (steps at 3) and its hyper-parameters, for a direct call."""
    params = _params(device, dtype, shapes)
    lists = [
        params,
        _grads(params, 0),
        [torch.randn_like(p) * 0.1 for p in params],
        [torch.rand_like(p) * 0.1 for p in params],
        [torch.rand_like(p) * 0.2 for p in params] if amsgrad else [],
        [torch.full((), 3.0, device=device) for _ in params],
    ]
    hyper = {
        "lr": 1e-2,
        "beta1": 0.9,
        "beta2": 0.999,
        "weight_decay": 0.01,
        "eps": 1e-8,
        "amsgrad": amsgrad,
        "maximize": False,
        "decoupled_weight_decay": True,
    }
    return lists, hyper


def _clone_lists(lists: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    return [[t.clone() for t in lst] for lst in lists]


Lists = list[list[torch.Tensor]]
_LIST_NAMES = ("params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "steps")


def _reference_of(lists: Lists, hyper: dict, **scalars) -> tuple[Lists, Lists | None]:
    """What one fused_adam call on `lists` must give, computed before it runs: fastops.reference on
    float64 CPU copies and, when the params are fp16/bf16, on CPU copies in their own dtype (torch's
    own rounding, which the 2x rule allows twice over)."""
    exact = [[t.detach().cpu().double() for t in lst] for lst in lists]
    reference.adam_step(*exact, **hyper, **scalars)
    eager = None
    if any(p.dtype in HALF_DTYPES for p in lists[0]):
        eager = [[t.detach().cpu().clone() for t in lst] for lst in lists]
        reference.adam_step(*eager, **hyper, **scalars)
    return exact, eager


def _assert_matches(lists: Lists, exact: Lists, eager: Lists | None = None) -> None:
    """Every tensor of the six lists (grads and steps included) against _reference_of's result: fp32
    near assert_close's defaults, fp16/bf16 element by element by the 2x rule (one step only)."""

    def cat(ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1).cpu() for t in ts])

    for k, name in enumerate(_LIST_NAMES):
        if not lists[k]:
            continue
        triples = [(t, exact[k][i], None if eager is None else eager[k][i]) for i, t in enumerate(lists[k])]
        try:  # one comparison per list, so thousands of tiny tensors stay fast
            assert_close_to_reference(
                cat(lists[k]), cat(exact[k]), eager=None if eager is None else cat(eager[k])
            )
        except AssertionError:
            for i, (t, e, g) in enumerate(triples):  # name the first tensor that fails
                try:
                    assert_close_to_reference(t, e, eager=g)
                except AssertionError as err:
                    raise AssertionError(f"{name}[{i}]: {err}") from None
            raise


@devices
@pytest.mark.parametrize("amsgrad", [False, True], ids=["", "amsgrad"])
def test_found_inf_skips_everything(device: str, amsgrad: bool) -> None:
    lists, hyper = _functional_args(device, amsgrad)
    before = _clone_lists(lists)
    scale = torch.tensor(8.0, device=device)
    fused_adam(*lists, **hyper, grad_scale=scale, found_inf=torch.ones((), device=device))
    for lst, old in zip(lists, before, strict=True):
        for t, t0 in zip(lst, old, strict=True):
            assert torch.equal(t, t0), "found_inf: a tensor (or a step) changed"
    # found_inf == 0: a normal step (and the steps advance).
    expected = _clone_lists(lists)
    fused_adam(*lists, **hyper, grad_scale=scale, found_inf=torch.zeros((), device=device))
    reference.adam_step(*expected, **hyper, grad_scale=scale, found_inf=torch.zeros(()))
    for lst, exp in zip(lists, expected, strict=True):
        for t, e in zip(lst, exp, strict=True):
            torch.testing.assert_close(t, e)
    assert all(float(s) == 4.0 for s in lists[5])


@devices
def test_grad_scale_unscales_and_writes_grads_back(device: str) -> None:
    lists, hyper = _functional_args(device)
    scale = torch.tensor(1024.0, device=device)
    expected = _clone_lists(lists)
    lists[1] = [g * 1024 for g in lists[1]]
    fused_adam(*lists, **hyper, grad_scale=scale)
    reference.adam_step(*expected, **hyper)
    for lst, exp in zip(lists, expected, strict=True):
        for t, e in zip(lst, exp, strict=True):
            torch.testing.assert_close(t, e)  # grads included: written back unscaled, as torch's fused Adam


def _amp_model(device: str) -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)


@devices
@pytest.mark.parametrize("unscale_first", [False, True], ids=["scaler_step", "unscale_clip_step"])
def test_grad_scaler(device: str, unscale_first: bool) -> None:
    """A real torch.amp.GradScaler: ours gets grad_scale/found_inf (or, after unscale_(), found_inf
    only); torch.optim.AdamW is unscaled by the scaler itself. One step has an inf gradient."""
    runs = {}
    for name, cls in (("ours", FusedAdamW), ("torch", torch.optim.AdamW)):
        model = _amp_model(device)
        opt = (
            cls(model.parameters(), lr=1e-2)
            if name == "ours"
            else cls(model.parameters(), lr=1e-2, foreach=False)
        )
        scaler = torch.amp.GradScaler(device, init_scale=2.0**12, growth_interval=2)
        gen = torch.Generator().manual_seed(5)
        for k in range(6):
            x = torch.randn(8, 16, generator=gen).to(device)
            loss = model(x).square().mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            if k == 2:
                model[0].weight.grad[0, 0] = math.inf
            if unscale_first:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
        assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
        runs[name] = (model, opt, scaler.get_scale())
    (ours, opt, scale), (theirs, ref, ref_scale) = runs["ours"], runs["torch"]
    assert scale == ref_scale
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b)
        assert (
            float(opt.state[a]["step"]) == float(ref.state[b]["step"]) == 5.0
        )  # the inf step is not counted
        torch.testing.assert_close(a.grad, b.grad)  # grads end unscaled either way


# --- Every CUDA path (each also run on the CPU), and scalars crossing devices -----------------------


def _packed(tensors: list[torch.Tensor], lead: int) -> list[torch.Tensor]:
    """Copies of `tensors` as consecutive views into one flat buffer (zeros elsewhere), the first at
    element `lead`, the last moved up to a multiple of 16 elements (so it stays 16-byte aligned)."""
    starts, end = [], lead
    for i, t in enumerate(tensors):
        if i == len(tensors) - 1:
            end = -(-end // 16) * 16
        starts.append(end)
        end += t.numel()
    flat = torch.zeros(end, dtype=tensors[0].dtype, device=tensors[0].device)
    views = [flat[s : s + t.numel()].view(t.shape) for s, t in zip(starts, tensors, strict=True)]
    for v, t in zip(views, tensors, strict=True):
        v.copy_(t)
    return views


def _padding(views: list[torch.Tensor]) -> torch.Tensor:
    """The elements of the views' flat buffer that no view covers."""
    flat = views[0]._base
    assert flat is not None
    covered = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    for v in views:
        covered[v.storage_offset() : v.storage_offset() + v.numel()] = True
    return flat[~covered]


@devices
@dtypes
@pytest.mark.parametrize("amsgrad", [False, True], ids=["", "amsgrad"])
def test_unaligned_views_into_flat_buffers(device: str, dtype: torch.dtype, amsgrad: bool) -> None:
    """Params, grads, moments and steps as views into one flat buffer per list at odd element offsets,
    as DDP gradient buckets and flat-param schemes lay them out: not 16-byte aligned, so CUDA takes the
    element-wise path (one tensor spans two blocks), while the aligned last tensor in the same launch
    keeps the vector path. Under grad_scale (grads written back), with Adam's L2 decay."""
    shapes = [(16384 + 37,), (5,), (3, 7), (1000,), (0,), (64, 33)]
    lists, hyper = _functional_args(device, amsgrad, dtype, shapes)
    hyper["decoupled_weight_decay"] = False
    scale = torch.tensor(8.0, device=device)
    lists[1] = [g * 8 for g in lists[1]]
    lists = [_packed(lst, lead=2 * k + 1) if lst else lst for k, lst in enumerate(lists)]
    assert all(lst[0].data_ptr() % 16 and lst[-1].data_ptr() % 16 == 0 for lst in lists if lst)
    exact, eager = _reference_of(lists, hyper, grad_scale=scale)
    fused_adam(*lists, **hyper, grad_scale=scale)
    _assert_matches(lists, exact, eager)
    for name, lst in zip(_LIST_NAMES, lists, strict=True):
        if lst:
            assert not _padding(lst).any(), f"{name}: an element between the views was written"


@devices
@pytest.mark.parametrize("amsgrad", [False, True], ids=["", "amsgrad"])
def test_more_tensors_than_one_launch_holds(device: str, amsgrad: bool) -> None:
    """4100 small tensors (every 13th empty): more than one CUDA update launch's table holds (613, 532
    with amsgrad) and more than one step-increment launch (4063). Each tensor's own step drives its bias
    corrections; with found_inf set, no launch touches anything."""
    shapes = [((i * 7) % 13,) for i in range(4100)]
    lists, hyper = _functional_args(device, amsgrad, shapes=shapes)
    lists[5] = [torch.full((), float(i % 5), device=device) for i in range(len(shapes))]
    exact, _ = _reference_of(lists, hyper)
    fused_adam(*lists, **hyper)
    _assert_matches(lists, exact)
    before = _clone_lists(lists)
    fused_adam(*lists, **hyper, found_inf=torch.ones((), device=device))
    for name, lst, old in zip(_LIST_NAMES, lists, before, strict=True):
        assert all(torch.equal(t, t0) for t, t0 in zip(lst, old, strict=True)), f"found_inf: {name} changed"


# --- A param listed twice: updated once per occurrence, in list order, as torch's CPU fused Adam ----


def _repeated_rows(device: str, amsgrad: bool, order: str) -> Lists:
    """fused_adam's lists for params named by `order` ("a" > 2 CPU tasks, "b" tiny, "c" non-dense),
    each occurrence with the same tensors, as the optimizer builds them for a repeated param."""
    gen = torch.Generator().manual_seed(7)
    rows = {}
    for name, shape in (("a", (70001,)), ("b", (5,)), ("c", (6, 18))):
        p, g, m, v, x = (torch.randn(shape, generator=gen).to(device) for _ in range(5))
        v, x = v.abs() * 0.1, x.abs() * 0.2
        if name == "c":  # not dense: the kernels work on one copy of each, written back once
            p, g, m, v, x = (t[:, ::2] for t in (p, g, m, v, x))
        rows[name] = (p, g, m, v, x, torch.full((), 3.0, device=device))
    lists: Lists = [[rows[n][k] for n in order] for k in range(6)]
    if not amsgrad:
        lists[4] = []
    return lists


def _torch_fused_cpu(lists: Lists, hyper: dict, **scalars) -> Lists:
    """torch's fused Adam on CPU copies (one copy per distinct tensor): steps += 1 for every listed
    step, then torch._fused_adam(w)_, which updates the listed tensors one after another."""
    copies: dict[int, torch.Tensor] = {}
    cpu = [[copies.setdefault(id(t), t.detach().cpu().clone()) for t in lst] for lst in lists]
    torch._foreach_add_(cpu[5], 1)
    op = torch._fused_adamw_ if hyper["decoupled_weight_decay"] else torch._fused_adam_
    args = {k: v for k, v in hyper.items() if k != "decoupled_weight_decay"}
    op(*cpu, **args, **{k: v.cpu() for k, v in scalars.items()})
    return cpu


@devices
@pytest.mark.parametrize("amsgrad", [False, True], ids=["", "amsgrad"])
@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize("order", ["aba", "aab", "cbcac", "aaab"])
def test_param_listed_twice_is_updated_per_occurrence_like_torch_fused(
    device: str, amsgrad: bool, decoupled: bool, order: str
) -> None:
    """Each occurrence updates the param in turn, every one with t = step + k (k occurrences), the step
    ends k higher and the grad is unscaled once per occurrence: what torch's fused Adam does on the
    CPU. Before, the CPU kernel updated both occurrences at once from two threads (a race) with
    t = step + 1; on CUDA two blocks of one launch would race the same way."""
    _, hyper = _functional_args(device, amsgrad)
    hyper["decoupled_weight_decay"] = decoupled
    lists = _repeated_rows(device, amsgrad, order)
    scale = torch.tensor(2.0, device=device)
    expected = _torch_fused_cpu(lists, hyper, grad_scale=scale)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the race needed two threads; the rounds must not
    try:
        fused_adam(*lists, **hyper, grad_scale=scale)
    finally:
        torch.set_num_threads(threads)
    for name, lst, exp in zip(_LIST_NAMES, lists, expected, strict=True):
        for i, (t, e) in enumerate(zip(lst, exp, strict=True)):
            torch.testing.assert_close(t.cpu(), e, msg=lambda m, name=name, i=i: f"{name}[{i}]: {m}")
    # found_inf: nothing moves, the repeated steps included (their early increments are skipped too).
    before = _clone_lists(lists)
    fused_adam(*lists, **hyper, grad_scale=scale, found_inf=torch.ones((), device=device))
    for name, lst, old in zip(_LIST_NAMES, lists, before, strict=True):
        assert all(torch.equal(t, t0) for t, t0 in zip(lst, old, strict=True)), f"found_inf: {name} changed"


@devices
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_optimizer_with_a_param_listed_twice_matches_torch_fused(device: str, kind: str) -> None:
    """torch warns about a group that lists a param twice and, with fused=True on the CPU, updates it
    once per occurrence; FusedAdam does the same, on every device and run after run."""
    torch_cls, fast_cls = PAIRS[kind]
    base = _params("cpu", shapes=[(70001,), (5,), (3, 4)])

    def run(cls: type[torch.optim.Optimizer], dev: str, **kwargs) -> list[torch.Tensor]:
        a, b, c = _leaves([t.to(dev) for t in base])
        with pytest.warns(UserWarning, match="duplicate parameters"):
            opt = cls([a, b, a, c, a], lr=1e-2, amsgrad=True, **kwargs)
        _run(opt, [a, b, a, c, a], 3)
        assert float(opt.state[a]["step"]) == 9 and float(opt.state[b]["step"]) == 3
        return [t.detach().cpu() for t in (a, b, c)]

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = run(torch_cls, "cpu", fused=True)
        first = run(fast_cls, device)
        again = run(fast_cls, device)
    finally:
        torch.set_num_threads(threads)
    for t, e, t2 in zip(first, expected, again, strict=True):
        torch.testing.assert_close(t, e)
        assert torch.equal(t, t2), "two identical runs differ"


def _share_params(lists: Lists) -> None:
    buf = torch.zeros(11, device=lists[0][0].device)
    lists[0][:2] = [buf[:6], buf[4:9]]


def _share_steps(lists: Lists) -> None:
    lists[5][1] = lists[5][0]


def _repeat_with_other_tensors(lists: Lists) -> None:
    for lst in lists[:4] + lists[5:]:
        lst[1] = lst[0]
    lists[2][1] = lists[2][0].clone()


def _drop_last(k: int) -> Callable[[Lists], None]:
    return lambda lists: lists[k].pop()


def _set(k: int, i: int, make: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Lists], None]:
    def edit(lists: Lists) -> None:
        lists[k][i] = make(lists[k][i])

    return edit


# case: (edit of the six lists, hyper-parameter overrides, the error's words). Different params that
# share memory (or a step) would be written by two threads at once; a param listed twice must come
# with the same tensors both times.
REJECTIONS = {
    "list_size": (_drop_last(2), {}, r"expected exp_avgs to hold one tensor per param"),
    "grad_dtype": (_set(1, 0, lambda t: t.double()), {}, r"expected grads to have the dtype of params"),
    "state_shape": (_set(3, 1, lambda t: t[:-1]), {}, r"expected exp_avg_sqs to have the shape of params"),
    "step_dtype": (_set(5, 1, lambda t: t.double()), {}, r"1-element float32 tensor"),
    "negative_lr": (lambda lists: None, {"lr": -1e-3}, r"expected lr >= 0"),
    "params_share_memory": (_share_params, {}, r"params\[0\] and params\[1\] share memory"),
    "steps_share_memory": (_share_steps, {}, r"steps\[0\] and steps\[1\] share memory"),
    "param_repeated_with_other_tensors": (
        _repeat_with_other_tensors,
        {},
        r"params\[1\] is params\[0\] again but comes with other tensors",
    ),
}


@devices
@pytest.mark.parametrize("case", REJECTIONS)
def test_raw_op_rejects_bad_lists_and_changes_nothing(device: str, case: str) -> None:
    """Each check of the op's lists, on each device, one case a test (a crash names its case): a
    RuntimeError naming the op and what was expected, and not one tensor of the call changed."""
    edit, overrides, words = REJECTIONS[case]
    lists, hyper = _functional_args(device, shapes=[(6,), (5,), (3, 4)])
    edit(lists)
    before = [[t.clone() for t in lst] for lst in lists]
    with pytest.raises(RuntimeError, match=r"fastops\.fused_adam_: .*" + words):
        fused_adam(*lists, **{**hyper, **overrides})
    for lst, saved in zip(lists, before, strict=True):
        for t, t0 in zip(lst, saved, strict=True):
            assert torch.equal(t, t0), f"{case}: a rejected call changed a tensor"


@devices
@dtypes
def test_non_dense_grads_written_back_unscaled(device: str, dtype: torch.dtype) -> None:
    """Grads laid out unlike their params (column-major; a strided slice of a bigger buffer) under
    grad_scale: the kernel works on dense copies, and the unscaled grads land in the caller's tensors,
    in their layout, leaving the rest of the buffer alone."""
    lists, hyper = _functional_args(device, dtype=dtype, shapes=[(7, 5), (33, 17), (4, 9)])
    scale = torch.tensor(16.0, device=device)
    column_major, sliced, dense = (g * 16 for g in lists[1])
    column_major = column_major.t().contiguous().t()
    buffer = torch.zeros(33, 34, dtype=dtype, device=device)
    buffer[:, ::2] = sliced
    lists[1] = [column_major, buffer[:, ::2], dense]
    assert lists[1][0].stride() == (1, 7) and lists[1][1].stride() == (34, 2)  # dense; not dense
    exact, eager = _reference_of(lists, hyper, grad_scale=scale)
    fused_adam(*lists, **hyper, grad_scale=scale)
    _assert_matches(lists, exact, eager)
    assert lists[1][0].stride() == (1, 7) and not buffer[:, 1::2].any()


@contextlib.contextmanager
def _no_host_sync(device: str) -> Iterator[None]:
    """On CUDA, any host-device sync inside raises; on the CPU, nothing."""
    if device != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _assert_state_close_to_float64(ours: torch.optim.Optimizer, exact: torch.optim.Optimizer) -> None:
    """Params and state of `ours` against a float64 run of the same steps (assert_close defaults)."""
    for (p, state), (q, ref_state) in zip(ours.state.items(), exact.state.items(), strict=True):
        assert state.keys() == ref_state.keys()
        for key in state:
            try:
                assert_close_to_reference(state[key], ref_state[key])
            except AssertionError as err:
                raise AssertionError(f"state {key} of a {tuple(p.shape)} param: {err}") from None
        assert_close_to_reference(p, q)


@devices
@pytest.mark.parametrize("lr_dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_tensor_lr_on_the_params_device(device: str, lr_dtype: torch.dtype) -> None:
    """A tensor lr on the params' device, read by the kernel there (float64 and bf16 ones cast on the
    device), with Adam's L2 decay, amsgrad and maximize, against torch.optim.Adam in float64; an
    in-place change (a scheduler's) reaches the next step. On CUDA the steps make no host sync."""
    base = _params(device)
    lr = torch.tensor(1e-2, dtype=lr_dtype, device=device)
    kwargs = {"weight_decay": 0.1, "amsgrad": True, "maximize": True}
    ours, exact = _leaves(base), _leaves(base, torch.float64)
    opt = FusedAdam(_groups(ours, lr), lr=lr, **kwargs)
    ref = torch.optim.Adam(_groups(exact, float(lr)), lr=float(lr), foreach=False, **kwargs)
    for k in range(STEPS):
        for p, q, g in zip(ours, exact, _grads(ours, k), strict=True):
            p.grad, q.grad = g, g.double()
        with _no_host_sync(device):
            opt.step()
        ref.step()
        if k == 3:
            for ours_group, ref_group in zip(opt.param_groups, ref.param_groups, strict=True):
                ours_group["lr"].mul_(0.5)  # exact in every lr dtype
                ref_group["lr"] *= 0.5
    _assert_state_close_to_float64(opt, ref)


@devices
@pytest.mark.parametrize("bad", [-1e-3, math.nan], ids=["negative", "nan"])
def test_cpu_tensor_lr_is_checked_at_every_step(device: str, bad: float) -> None:
    """A CPU tensor lr is read on the host and checked at every step on both devices: made negative or
    NaN after construction, the step raises naming the op and lr, and leaves everything as it was. The
    op itself takes a CPU lr for params of either device. A tensor lr on the device is checked when the
    optimizer is built and when a group is added."""
    p = torch.randn(5, device=device, requires_grad=True)
    lr = torch.tensor(1e-2)
    opt = FusedAdam([p], lr=lr)
    p.grad = torch.ones(5, device=device)
    opt.step()
    before, step = p.detach().clone(), opt.state[p]["step"].clone()
    lr.fill_(bad)
    with pytest.raises(RuntimeError, match=r"fastops\.fused_adam_: expected lr >= 0, got"):
        opt.step()
    assert torch.equal(p.detach(), before) and torch.equal(opt.state[p]["step"], step)

    lists, hyper = _functional_args(device)
    floats = [0.0, *list(hyper.values())[1:]]  # lr_tensor replaces the float lr
    with pytest.raises(RuntimeError, match=r"fastops\.fused_adam_: expected lr >= 0, got"):
        torch.ops.fastops.fused_adam_(*lists, torch.tensor(bad), *floats)
    exact, _ = _reference_of(lists, hyper)
    torch.ops.fastops.fused_adam_(*lists, torch.tensor(hyper["lr"], dtype=torch.float64), *floats)
    _assert_matches(lists, exact)

    for cls in (FusedAdam, FusedAdamW):
        with pytest.raises(ValueError, match="invalid learning rate"):
            cls([p], lr=torch.tensor(bad, device=device))
        opt = cls([p], lr=torch.tensor(1e-2, device=device))
        with pytest.raises(ValueError, match="invalid learning rate"):
            opt.add_param_group(
                {"params": [torch.zeros(2, device=device)], "lr": torch.tensor(bad, device=device)}
            )


def _state_lists(opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> Lists:
    """Each state entry (step included) of every param, one list per key."""
    return [[opt.state[p][key] for p in params] for key in opt.state[params[0]]]


def _scaler_steps(
    opt: torch.optim.Optimizer,
    params: list[torch.Tensor],
    scaler: torch.amp.GradScaler,
    steps: int,
    inf_step: int | None,
) -> Iterator[list[torch.Tensor]]:
    """`steps` steps of `opt` under a real `scaler`, with _grads' gradients scaled by it (a power of
    two, so unscaling gives them back exactly) and an inf in params[0]'s grad at `inf_step`. Checks
    that the skipped step changed nothing (params, grads, state, steps) and that every other step wrote
    the grads back unscaled; yields the grads of each step taken, for the reference runs."""
    scaler.scale(torch.ones((), device=params[0].device))  # creates the scale, as scaling the loss would
    for k in range(steps):
        grads = _grads(params, k)
        scale = scaler.get_scale()
        for p, g in zip(params, grads, strict=True):
            p.grad = g * scale
        if k == inf_step:
            params[0].grad.view(-1)[0] = math.inf
            before = _clone_lists([params, [p.grad for p in params], *_state_lists(opt, params)])
        scaler.step(opt)
        scaler.update()
        if k == inf_step:
            after = [params, [p.grad for p in params], *_state_lists(opt, params)]
            for name, lst, old in zip(["params", "grads", *opt.state[params[0]]], after, before, strict=True):
                assert all(torch.equal(t, t0) for t, t0 in zip(lst, old, strict=True)), (
                    f"skipped step: {name} changed"
                )
            assert scaler.get_scale() == scale / 2
            continue
        for p, g in zip(params, grads, strict=True):
            assert torch.equal(p.grad, g), f"grad on {p.device} not written back unscaled"
        yield grads


@devices
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_grad_scaler_with_half_params(device: str, dtype: torch.dtype) -> None:
    """fp16/bf16 params under a real torch.amp.GradScaler: the kernel unscales the grads and writes
    them back unscaled; on the step with an inf, params, grads, moments and steps all stay as they
    were; the steps taken follow the 2x rule against torch.optim.AdamW."""
    base = [p * 0.1 for p in _params(device, dtype)]
    kwargs = {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4, "amsgrad": True}
    ours, theirs, exact = _leaves(base), _leaves(base), _leaves(base, torch.float64)
    opt = FusedAdamW(ours, **kwargs)
    ref, ref64 = (
        torch.optim.AdamW(theirs, foreach=False, **kwargs),
        torch.optim.AdamW(exact, foreach=False, **kwargs),
    )
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=1000)
    for grads in _scaler_steps(opt, ours, scaler, steps=4, inf_step=2):
        for b, c, g in zip(theirs, exact, grads, strict=True):
            b.grad, c.grad = g.clone(), g.double()
        ref.step()
        ref64.step()
    assert all(float(opt.state[p]["step"]) == 3.0 for p in ours)
    _assert_2x_rule((opt, ours), (ref, theirs), (ref64, exact))


class _CopyRecorder(torch.overrides.TorchFunctionMode):
    """Records every Tensor.to as (source device, target device, non_blocking), and brings meta tensors
    (stand-ins for CUDA scalars on a machine with no GPU) to the CPU as the values they stand for."""

    def __init__(self, values: dict[int, float]) -> None:
        super().__init__()
        self.values = values
        self.copies: list[tuple[torch.device, torch.device | None, bool]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            src = args[0]
            device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            self.copies.append((src.device, device, non_blocking))
            if src.is_meta and device is not None and device.type == "cpu":
                return torch.full(src.shape, self.values[id(src)], dtype=dtype or src.dtype)
        return func(*args, **kwargs)


def test_device_scalars_reach_cpu_params_by_blocking_copies() -> None:
    """CPU params whose lr, grad_scale and found_inf live on a device (a CPU group with a CUDA lr
    under a CUDA GradScaler): the CPU kernel reads them the moment it is called, so each must be copied
    over blocking; a non_blocking copy into the CPU may not have landed yet. Meta tensors stand in for
    CUDA ones, so this runs without a GPU (see test_cpu_group_with_cuda_lr_under_cuda_grad_scaler)."""
    lists, hyper = _functional_args("cpu", amsgrad=True)
    values = {"lr": hyper.pop("lr"), "grad_scale": 4.0, "found_inf": 0.0}
    on_device = {name: torch.empty((), device="meta") for name in values}
    lists[1] = [g * 4 for g in lists[1]]
    exact, _ = _reference_of(
        lists, {**hyper, "lr": values["lr"]}, grad_scale=torch.tensor(4.0), found_inf=torch.tensor(0.0)
    )
    recorder = _CopyRecorder({id(on_device[name]): v for name, v in values.items()})
    with recorder:
        fused_adam(*lists, **hyper, **on_device)
    into_cpu = [c for c in recorder.copies if c[1] is not None and c[1].type == "cpu"]
    assert len(into_cpu) == 3, recorder.copies
    assert not any(non_blocking for *_, non_blocking in into_cpu), (
        f"non-blocking copies into the CPU: {into_cpu}"
    )
    _assert_matches(lists, exact)


def _checkpoint(state_dict: dict) -> dict:
    """Through torch.save / torch.load, as a real checkpoint travels."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer)


@devices
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_state_dict_round_trips(device: str, kind: str) -> None:
    torch_cls, fast_cls = PAIRS[kind]
    base = _params(device)
    kwargs = {"lr": 1e-2, "amsgrad": True, "weight_decay": 0.02}
    # torch -> fastops: 3 steps in torch, load into fastops, 4 more steps in each.
    a, b = _leaves(base), _leaves(base)
    ref = torch_cls(_groups(a, 1e-2), foreach=False, **kwargs)
    _run(ref, a, 3)
    ours = fast_cls(_groups(b, 1e-2), **kwargs)
    with torch.no_grad():
        for p, q in zip(a, b, strict=True):
            q.copy_(p)
    sd = _checkpoint(ref.state_dict())
    ours.load_state_dict(sd)
    for key in sd["state"]:
        assert set(ours.state_dict()["state"][key]) == set(sd["state"][key])
    assert ours.state_dict()["param_groups"][1].keys() == sd["param_groups"][1].keys()
    _run(ref, a, 4, start=3)
    _run(ours, b, 4, start=3)
    _assert_state_equal(ours, ref)
    # fastops -> torch: load ours into a fresh torch optimizer and continue both.
    c = _leaves([p.detach() for p in b])
    ref2 = torch_cls(_groups(c, 1e-2), foreach=False, **kwargs)
    ref2.load_state_dict(_checkpoint(ours.state_dict()))
    _run(ours, b, 3, start=7)
    _run(ref2, c, 3, start=7)
    _assert_state_equal(ours, ref2)


def test_state_dict_layout_matches_torch() -> None:
    base = _params("cpu")
    for torch_cls, fast_cls in PAIRS.values():
        a, b = _leaves(base), _leaves(base)
        ours, ref = fast_cls(a, amsgrad=True), torch_cls(b, amsgrad=True, foreach=False)
        _run(ours, a, 1)
        _run(ref, b, 1)
        sd_ours, sd_ref = ours.state_dict(), ref.state_dict()
        assert sd_ours["param_groups"][0].keys() == sd_ref["param_groups"][0].keys()
        for key, state in sd_ref["state"].items():
            layout = {k: (v.dtype, v.shape, v.device) for k, v in state.items()}
            assert {k: (v.dtype, v.shape, v.device) for k, v in sd_ours["state"][key].items()} == layout


@devices
def test_tensor_lr_updated_in_place_and_params_without_grad(device: str) -> None:
    base = _params(device)
    lr_a, lr_b = torch.tensor(1e-2), torch.tensor(1e-2)
    ours, theirs = _leaves(base), _leaves(base)
    opt, ref = FusedAdam(ours, lr=lr_a), torch.optim.Adam(theirs, lr=lr_b, foreach=False)
    for k in range(4):
        for i, (p, q, g) in enumerate(zip(ours, theirs, _grads(ours, k), strict=True)):
            skip = i == 0 and k % 2 == 0  # a param with no grad this step: no update, no step count
            p.grad, q.grad = (None, None) if skip else (g.clone(), g.clone())
        opt.step()
        ref.step()
        lr_a.mul_(0.5)
        lr_b.mul_(0.5)
    _assert_state_equal(opt, ref)
    assert float(opt.state[ours[0]]["step"]) == 2.0


def test_decoupled_flag_closure_and_defaults() -> None:
    """FusedAdam(decoupled_weight_decay=True) is AdamW; step(closure) returns the loss; defaults as torch."""
    base = _params("cpu")
    a, b = _leaves(base), _leaves(base)
    opt = FusedAdam(a, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)
    ref = torch.optim.AdamW(b, lr=1e-2, weight_decay=0.1, foreach=False)
    _run(opt, a, 3)
    _run(ref, b, 3)
    _assert_state_equal(opt, ref)
    assert opt.step(lambda: 1.5) == 1.5
    for fast_cls, torch_cls in ((FusedAdam, torch.optim.Adam), (FusedAdamW, torch.optim.AdamW)):
        ours, theirs = fast_cls([torch.zeros(1)]).defaults, torch_cls([torch.zeros(1)]).defaults
        assert {k: ours[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")} == {
            k: theirs[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")
        }


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"lr": -1e-3}, ValueError, "learning rate"),
        ({"lr": math.nan}, ValueError, "learning rate"),
        ({"betas": (1.0, 0.999)}, ValueError, "beta parameter at index 0"),
        ({"betas": (0.9, -0.1)}, ValueError, "beta parameter at index 1"),
        ({"betas": (0.9, 0.999, 0.5)}, ValueError, "betas must be a pair"),
        ({"eps": -1e-8}, ValueError, "epsilon"),
        ({"weight_decay": -0.1}, ValueError, "weight_decay"),
        ({"lr": torch.ones(2)}, ValueError, "1-element"),
        ({"foreach": True}, RuntimeError, "foreach"),
        ({"fused": False}, RuntimeError, "fused"),
        ({"differentiable": True}, RuntimeError, "differentiable"),
    ],
)
def test_bad_hyperparameters(kwargs: dict, error: type[Exception], match: str) -> None:
    p = torch.zeros(3, requires_grad=True)
    for cls in (FusedAdam, FusedAdamW):
        with pytest.raises(error, match=match):
            cls([p], **kwargs)
        opt = cls([p])
        bad_group = {"params": [torch.zeros(2, requires_grad=True)], **kwargs}
        if "lr" in kwargs or "betas" in kwargs or "eps" in kwargs or "weight_decay" in kwargs:
            with pytest.raises(error, match=match):
                opt.add_param_group(bad_group)
            assert len(opt.param_groups) == 1


def _outcome(make: Callable[[], object]) -> type[Exception] | None:
    try:
        make()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e)
    return None


# Constructor arguments torch.optim.Adam(fused=True) rejects (or accepts), each with the exception type
# it raises; FusedAdam must fail (or not) the same way. Extra checks of ours are in test_bad_hyperparameters.
CONSTRUCTOR_CASES = {
    "lr<0": {"lr": -1e-3},
    "lr=nan": {"lr": math.nan},
    "lr=inf": {"lr": math.inf},
    "lr=str": {"lr": "0.1"},
    "lr=None": {"lr": None},
    "lr=tensor<0": {"lr": torch.tensor(-1.0)},
    "lr=2 elements": {"lr": torch.ones(2)},
    "lr=tensor, foreach": {"lr": torch.tensor(1e-3), "foreach": True},
    "eps<0": {"eps": -1.0},
    "eps=nan": {"eps": math.nan},
    "eps=str": {"eps": "x"},
    "eps=2 elements": {"eps": torch.ones(2)},
    "weight_decay<0": {"weight_decay": -1.0},
    "weight_decay=inf": {"weight_decay": math.inf},
    "weight_decay=str": {"weight_decay": "x"},
    "betas=(1, .999)": {"betas": (1.0, 0.999)},
    "betas=(nan, .999)": {"betas": (math.nan, 0.999)},
    "betas=(.9,)": {"betas": (0.9,)},
    "betas=None": {"betas": None},
    "betas=str": {"betas": "ab"},
    "betas=2 elements": {"betas": (torch.tensor(0.9), torch.tensor([0.99, 0.5]))},
    "betas=tensors >= 1": {"betas": (torch.tensor(1.5), torch.tensor(0.9))},
    "betas=float and tensor": {"betas": (0.9, torch.tensor(0.99))},
    "betas=tensor and float": {"betas": (torch.tensor(0.9), 0.99)},
    "betas=ints": {"betas": (0, 0.999)},
    "betas=tensors": {"betas": (torch.tensor(0.9), torch.tensor([0.99]))},
    "betas=tensors, foreach": {"betas": (torch.tensor(0.9), torch.tensor(0.99)), "foreach": True},
    "foreach": {"foreach": True},
    "differentiable": {"differentiable": True},
    "foreach and differentiable": {"foreach": True, "differentiable": True},
    "foreach, capturable": {"foreach": True, "capturable": True, "lr": torch.tensor(1e-3)},
}


@pytest.mark.parametrize("kwargs", CONSTRUCTOR_CASES.values(), ids=CONSTRUCTOR_CASES.keys())
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_constructor_errors_have_torchs_exception_types(kwargs: dict, kind: str) -> None:
    """A drop-in fails where and as the original fails: the exception type of torch's fused Adam
    (our messages name the class and say what was expected)."""
    torch_cls, fast_cls = PAIRS[kind]
    fused = {} if "fused" in kwargs else {"fused": True}
    expected = _outcome(lambda: torch_cls([torch.zeros(3, requires_grad=True)], **kwargs, **fused))
    got = _outcome(lambda: fast_cls([torch.zeros(3, requires_grad=True)], **kwargs))
    assert got is expected


@pytest.mark.parametrize(
    "params, error",
    [([], ValueError), ([torch.zeros(3, requires_grad=True) * 2], ValueError), (torch.zeros(3), TypeError)],
    ids=["empty", "non-leaf", "a tensor"],
)
def test_params_errors_come_first_as_in_torch(params: object, error: type[Exception]) -> None:
    """torch checks the params before the fused flags: a bad params list wins over foreach=True."""
    with pytest.raises(error):
        torch.optim.AdamW(params, foreach=True, fused=True)  # type: ignore[arg-type]
    with pytest.raises(error):
        FusedAdamW(params, foreach=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_tensor_betas_are_kept_and_read_at_every_step(kind: str) -> None:
    """As in torch: param_groups hold the caller's beta tensors (squeezed to 0-d views), and a change
    made in place after construction reaches the next step."""
    torch_cls, fast_cls = PAIRS[kind]
    base = _params("cpu", shapes=[(7, 5), (33,), ()])
    ours, theirs = _leaves(base), _leaves(base)
    betas_ours = (torch.tensor(0.9), torch.tensor([0.999]))
    betas_theirs = (torch.tensor(0.9), torch.tensor([0.999]))
    opt = fast_cls(ours, lr=1e-2, betas=betas_ours)
    ref = torch_cls(theirs, lr=1e-2, betas=betas_theirs, fused=True)
    for opt_, given in ((opt, betas_ours), (ref, betas_theirs)):
        kept = opt_.param_groups[0]["betas"]
        assert isinstance(kept, tuple) and all(isinstance(b, torch.Tensor) and b.dim() == 0 for b in kept)
        assert kept[0] is given[0] and kept[1].data_ptr() == given[1].data_ptr()
    _run(opt, ours, 2)
    _run(ref, theirs, 2)
    for b in (*betas_ours, *betas_theirs):
        b.mul_(0.5)  # 0.45 and 0.4995 from now on
    _run(opt, ours, 2, start=2)
    _run(ref, theirs, 2, start=2)
    _assert_state_equal(opt, ref)
    # Without the change the result differs: the new betas were used.
    stale = _leaves(base)
    stale_opt = fast_cls(stale, lr=1e-2, betas=(0.9, 0.999))
    _run(stale_opt, stale, 4)
    assert not torch.equal(stale[0], ours[0])


def test_bad_hyperparameters_at_step() -> None:
    """A group changed after construction (by hand or by a loaded checkpoint) fails at step()."""
    p = torch.zeros(3, requires_grad=True)
    opt = FusedAdam([p])
    p.grad = torch.ones(3)
    opt.param_groups[0]["betas"] = (1.5, 0.999)
    with pytest.raises(RuntimeError, match=r"fused_adam_: expected beta1 in \[0, 1\)"):
        opt.step()
    opt.param_groups[0]["betas"] = (0.9, 0.999)
    opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(RuntimeError, match="expected lr >= 0"):
        opt.step()


def test_sparse_grads_and_complex_params_are_rejected() -> None:
    emb = torch.nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        FusedAdam(emb.parameters()).step()
    z = torch.zeros(3, dtype=torch.complex64, requires_grad=True)
    z.grad = torch.ones(3, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match="complex params"):
        FusedAdam([z]).step()
    # The raw op says the same without the optimizer in front.
    lists, hyper = _functional_args("cpu")
    lists[0] = [p.to(torch.complex64) for p in lists[0]]
    with pytest.raises(RuntimeError, match="complex params are not supported"):
        torch.ops.fastops.fused_adam_(*lists, None, *hyper.values())


def test_opcheck() -> None:
    lists, hyper = _functional_args("cpu", amsgrad=True)
    lists = [[t for t, shape in zip(lst, SHAPES, strict=False) if shape != (0,)] for lst in lists]
    torch.library.opcheck(
        torch.ops.fastops.fused_adam_.default,
        (*lists, None, *hyper.values()),
        {"grad_scale": torch.tensor(2.0), "found_inf": torch.tensor(0.0)},
        test_utils=("test_schema", "test_faketensor"),
    )


def test_version_counters_are_bumped() -> None:
    """Like torch's in-place updates: autograd notices a param that was stepped after being saved."""
    w = torch.randn(4, requires_grad=True)
    opt = FusedAdam([w])
    w.grad = torch.ones(4)
    y = (w * w).sum()  # saves w for backward
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@devices
def test_torch_compile_step(device: str) -> None:
    torch._dynamo.reset()
    base = _params(device, shapes=[(7, 5), (), (33,), (0,)])
    ours, theirs = _leaves(base), _leaves(base)
    opt = FusedAdamW(ours, lr=1e-2, amsgrad=True)
    ref = torch.optim.AdamW(theirs, lr=1e-2, amsgrad=True, foreach=False)

    @torch.compile(fullgraph=True)
    def step() -> None:
        opt.step()

    for k in range(3):
        for p, q, g in zip(ours, theirs, _grads(ours, k), strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        step()
        ref.step()
    _assert_state_equal(opt, ref)


# --- CUDA only: capturable, CUDA graphs, scalars and params across devices, past 2^31 elements ------


@cuda_only
def test_capturable_refuses_cpu_tensor_lr_for_cuda_params() -> None:
    p = torch.zeros(3, device="cuda", requires_grad=True)
    p.grad = torch.ones(3, device="cuda")
    with pytest.raises(RuntimeError, match="capturable=True a Tensor lr must live"):
        FusedAdam([p], lr=torch.tensor(1e-3), capturable=True).step()
    FusedAdam([p], lr=torch.tensor(1e-3)).step()  # without capturable the CPU value is read on the host


@cuda_only
def test_cuda_graph_capture_of_a_training_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).cuda()
    ref_model = torch.nn.Linear(64, 64).cuda()
    ref_model.load_state_dict(model.state_dict())
    lr = torch.tensor(1e-2, device="cuda")
    opt = FusedAdamW(model.parameters(), lr=lr, capturable=True)
    ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-2, foreach=False)
    x = torch.randn(16, 64, device="cuda")

    def train_step() -> None:
        opt.zero_grad(set_to_none=False)
        model(x).square().mean().backward()
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up (creates the state) outside the graph
            train_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        train_step()
    for _ in range(3):
        ref.zero_grad()
        ref_model(x).square().mean().backward()
        ref.step()
    for _ in range(4):
        graph.replay()
        ref.zero_grad()
        ref_model(x).square().mean().backward()
        ref.step()
    torch.cuda.synchronize()
    # Capturing records the step without running it: 3 warm-up steps + 4 replays ran, as in the reference.
    assert float(opt.state[model.weight]["step"]) == 7.0
    for a, b in zip(model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@cuda_only
def test_one_group_on_two_devices() -> None:
    """A group holding CPU and CUDA params: one kernel call per device, lr/grad_scale/found_inf moved."""
    base = _params("cpu")
    base = [t if i % 2 else t.cuda() for i, t in enumerate(base)]
    ours, theirs = _leaves(base), _leaves(base)
    opt = FusedAdamW(ours, lr=torch.tensor(1e-2), amsgrad=True)
    ref = torch.optim.AdamW(theirs, lr=1e-2, amsgrad=True, foreach=False)
    _run(opt, ours, 3)
    _run(ref, theirs, 3)
    _assert_state_equal(opt, ref)
    assert all(opt.state[p]["step"].device == p.device for p in ours)


@cuda_only
def test_cpu_group_with_cuda_lr_under_cuda_grad_scaler(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA group and a CPU group whose lr is a CUDA tensor, under a CUDA GradScaler: the CPU kernel
    gets lr, grad_scale and found_inf from the GPU, copied blocking while the stream is kept busy (a
    non-blocking copy would not have landed when the kernel reads it); an inf in a CUDA grad skips the
    CPU group too; everything matches torch.optim.Adam in float64."""

    # torch's GradScaler hands its own scalars to the CPU grads with non_blocking=True (the same race):
    # make those copies blocking, so only ours is under test, and keep the stream busy after each.
    def blocking_get(self, device: torch.device) -> torch.Tensor:
        if device not in self._per_device_tensors:
            self._per_device_tensors[device] = self.master.to(device, copy=True)
            torch.cuda._sleep(20_000_000)
        return self._per_device_tensors[device]

    monkeypatch.setattr(torch.amp.grad_scaler._MultiDeviceReplicator, "get", blocking_get)
    base = [t.cuda() if i < 4 else t for i, t in enumerate(_params("cpu"))]
    ours, exact = _leaves(base), _leaves(base, torch.float64)
    kwargs = {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True}
    cuda_lr = torch.tensor(5e-3, device="cuda")
    opt = FusedAdam([{"params": ours[:4]}, {"params": ours[4:], "lr": cuda_lr}], **kwargs)
    ref = torch.optim.Adam(
        [{"params": exact[:4]}, {"params": exact[4:], "lr": 5e-3}], foreach=False, **kwargs
    )
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10, growth_interval=1000)
    for grads in _scaler_steps(opt, ours, scaler, steps=4, inf_step=1):  # the inf is found on the GPU
        for q, g in zip(exact, grads, strict=True):
            q.grad = g.double()
        ref.step()
    _assert_state_close_to_float64(opt, ref)
    assert all(float(opt.state[p]["step"]) == 3.0 for p in ours)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_params_on_a_second_gpu() -> None:
    """Params on cuda:1 while cuda:0 is current (one group spans both): the op guards the device and
    launches on cuda:1's stream; a tensor lr and a GradScaler on cuda:0 are copied over."""
    base = [t.to("cuda:1" if i % 3 else "cuda:0") for i, t in enumerate(_params("cpu"))]
    ours, exact = _leaves(base), _leaves(base, torch.float64)
    opt = FusedAdamW(_groups(ours, torch.tensor(1e-2, device="cuda:0")), amsgrad=True)
    ref = torch.optim.AdamW(_groups(exact, 1e-2), amsgrad=True, foreach=False)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10, growth_interval=1000)
    assert torch.cuda.current_device() == 0 and base[0].device == torch.device("cuda:0")
    for grads in _scaler_steps(opt, ours, scaler, steps=3, inf_step=None):
        for q, g in zip(exact, grads, strict=True):
            q.grad = g.double()
        ref.step()
    _assert_state_close_to_float64(opt, ref)
    assert all(opt.state[p]["step"].device == p.device for p in ours)


@cuda_only
@pytest.mark.large
def test_tensor_of_more_than_2_31_elements() -> None:
    """One bf16 tensor of 2^31 + 4099 elements (4.3 GB a list, 21.5 GB in all with amsgrad), then a
    small one in the same launch: 64-bit indexing past element 2^31, block offsets past it, and the
    element-wise tail (numel % 8 = 3). Checked on slices (the head, across 2^31, the tail) and the small
    tensor against the float64 reference of the same elements; the step is elementwise, so a slice's
    reference needs only that slice."""
    n, dtype = 2**31 + 4099, torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(scale: float) -> torch.Tensor:
        return torch.randn(n, generator=gen, dtype=dtype, device="cuda").mul_(scale)

    small, small_hyper = _functional_args("cuda", amsgrad=True, dtype=dtype, shapes=[(33,)])
    big = [randn(1.0), randn(1.0), randn(0.1), randn(0.1).abs_(), randn(0.2).abs_()]
    lists = [[t, *s] for t, s in zip(big, small, strict=False)] + [
        [torch.full((), 3.0, device="cuda"), *small[5]]
    ]
    scale = torch.tensor(2.0, device="cuda")
    slices = [(0, 1000), (2**31 - 20000, 2**31 + 20000), (n - 5000, n)]
    # The checked elements as views (so they show the result) and the small tensor, one step each.
    views = [[t[a:b] for a, b in slices] + s for t, s in zip(big, small, strict=False)]
    views.append([lists[5][0]] * len(slices) + [lists[5][1]])
    exact, eager = _reference_of(views, small_hyper, grad_scale=scale)
    fused_adam(*lists, **small_hyper, grad_scale=scale)
    _assert_matches(views, exact, eager)
    del big, lists, views
    torch.cuda.empty_cache()


# --- DDP --------------------------------------------------------------------------------------------


def _ddp_worker(rank: int, world_size: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import fastops.optim as fo

    dist.init_process_group(
        "gloo",
        # A file store: no port to race for, and no rank hosting a store the other still needs.
        init_method=f"file://{os.path.join(out_dir, 'rendezvous')}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        ref_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        ref_model.load_state_dict(model.state_dict())
        ddp, ref_ddp = DDP(model), DDP(ref_model)
        opt = fo.FusedAdamW(ddp.parameters(), lr=1e-2)
        ref = torch.optim.AdamW(ref_ddp.parameters(), lr=1e-2, foreach=False)
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
        for _ in range(5):
            x = torch.randn(4, 8, generator=gen)
            for net, o in ((ddp, opt), (ref_ddp, ref)):
                o.zero_grad()
                net(x).square().mean().backward()
                o.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        ref_flat = torch.cat([p.detach().reshape(-1) for p in ref_model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world_size)]
        dist.all_gather(gathered, flat)
        torch.save(
            {"flat": flat, "ref": ref_flat, "gathered": gathered}, os.path.join(out_dir, f"rank{rank}.pt")
        )
        dist.barrier()  # neither rank tears down while the other is still talking
    finally:
        dist.destroy_process_group()
    leave_spawned_worker()


def test_ddp_gloo_two_processes_identical_params() -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(_ddp_worker, args=(2, out_dir), nprocs=2, join=False, start_method="spawn")
        deadline = 150.0
        waited = 0.0
        while not ctx.join(timeout=5):
            waited += 5
            if waited >= deadline:
                for proc in ctx.processes:
                    proc.kill()
                pytest.fail("DDP workers did not finish within the timeout")
        results = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(2)]
    assert torch.equal(results[0]["gathered"][0], results[0]["gathered"][1])  # both ranks, bit-identical
    assert torch.equal(results[0]["flat"], results[1]["flat"])
    for r in results:
        torch.testing.assert_close(r["flat"], r["ref"])  # and what torch.optim.AdamW computes


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_capturable_on_cpu_is_refused_as_torch_refuses_it(kind: str) -> None:
    """torch.optim.Adam (single-tensor and foreach) refuses capturable=True for CPU params at step
    time with an AssertionError; ours accepted it (a CPU step is not captured by any graph)."""
    torch_cls, fast_cls = PAIRS[kind]
    for cls in (torch_cls, fast_cls):
        p = torch.zeros(3, requires_grad=True)
        p.grad = torch.ones(3)
        opt = cls([p], capturable=True)
        with pytest.raises(AssertionError, match=r"capturable=True"):
            opt.step()
    p = torch.zeros(3, requires_grad=True)
    p.grad = torch.ones(3)
    with pytest.raises(AssertionError, match=r"^fastops\.optim: capturable=True needs"):
        fast_cls([p], capturable=True).step()
