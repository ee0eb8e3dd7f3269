"""The one way a fastops module stands in for its torch twin.

* ``from_torch(m)`` builds the fastops module on the meta device (no memory, no initialisation) and
  then takes over ``m``'s own Parameter objects with :func:`share_parameters`, so optimizer state,
  ``state_dict`` keys and checkpoints stay interchangeable and training updates both at once.
* :func:`accept_state_dict_keys` lets ``load_state_dict`` take the key names of the torch modules a
  fastops module fuses (``nn.Sequential(nn.Linear, nn.GELU)`` saves ``0.weight``).
"""

from __future__ import annotations

from typing import Any

from torch import nn


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
