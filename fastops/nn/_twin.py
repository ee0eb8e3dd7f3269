"""The one way a fastops module stands in for its torch twin.

* ``from_torch(m)`` builds the fastops module on the meta device (no memory, no initialisation) and
  then takes over ``m``'s own Parameter objects with :func:`share_parameters`, so optimizer state,
  ``state_dict`` keys and checkpoints stay interchangeable and training updates both at once.
* :func:`forward_mismatch` checks, on a probe input, that a module of a class fastops does not own
  (timm's) computes what a swap rule assumes before the rule replaces it.
* :func:`accept_state_dict_keys` lets ``load_state_dict`` take the key names of the torch modules a
  fastops module fuses (``nn.Sequential(nn.Linear, nn.GELU)`` saves ``0.weight``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

# What a registered op raises for an input it refuses. For a Tensor x that is the kernel's own check,
# typed and worded as the public function's error (ShapeError, DtypeError, ...), which a module that
# calls its op directly lets through; for anything else the op's binding refused the argument in its
# own words, and the module runs the checked public function instead, which names what it expected.
REFUSED = (RuntimeError, TypeError, ValueError)


def share_parameters(
    module: nn.Module, source: nn.Module, names: tuple[str, ...] = ("weight", "bias")
) -> None:
    """Make ``module.<name>`` the very Parameter object (or None) that ``source.<name>`` is."""
    for name in names:
        setattr(module, name, getattr(source, name))


def accept_state_dict_keys(module: nn.Module, renames: dict[str, str]) -> None:
    """Before ``module.load_state_dict``, rename keys that start with ``prefix + old`` to ``prefix + new``
    for each ``old -> new`` in ``renames``, unless the new key is already there."""

    def rename(_module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        for old, new in renames.items():
            for key in [k for k in state_dict if k.startswith(prefix + old)]:
                target = prefix + new + key[len(prefix + old) :]
                if target not in state_dict:
                    state_dict[target] = state_dict.pop(key)

    module.register_load_state_dict_pre_hook(rename)


def forward_mismatch(
    module: nn.Module,
    expected: Callable[[Tensor], Tensor],
    shapes: Sequence[tuple[int, ...]],
    device: torch.device,
    dtype: torch.dtype,
) -> str | None:
    """Check that ``module``'s own forward (its hooks bypassed) computes ``expected`` on small probe
    inputs: how it differs, or None. This is how a swap rule confirms that a class fastops does not
    own does what its name or structure says. The probe draws from a private generator (the
    caller's random stream is untouched) and records no gradient."""
    if device.type == "meta":
        return "its parameters are on the meta device, so its forward cannot be checked"
    tolerance = {torch.float64: 1e-10, torch.float32: 1e-5}.get(dtype, 1e-2)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad(), torch.autocast(device.type, enabled=False):
        for shape in shapes:
            x = (3 * torch.randn(shape, generator=generator, dtype=torch.float64)).to(device, dtype)
            try:
                got, want = module.forward(x), expected(x)
            except Exception as error:  # noqa: BLE001  (any failure means: not what we assume)
                return f"its forward could not be checked on a probe input {tuple(shape)}: {error}"
            if not (
                isinstance(got, Tensor)
                and got.shape == want.shape
                and torch.allclose(got.double(), want.double(), rtol=tolerance, atol=tolerance)
            ):
                return f"its forward does not compute what the swap assumes (checked on a probe input {tuple(shape)})"
    return None
