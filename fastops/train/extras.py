"""Optional dependencies of fastops.train: found missing before training starts.

A feature the run needs (scikit-learn for the digits, torchvision for ImageFolder data and its
models, timm for its models) is an error up front naming what to install; a record that only
decorates a run (plots, TensorBoard events, the progress bar) is skipped with a one-line notice.
"""

from __future__ import annotations

import importlib
import sys

from fastops.train.config import ConfigError

INSTALL = "pip install fastops[train]"


def import_problem(module: str) -> str | None:
    """Why ``module`` cannot be imported, or None. It is imported, not just looked for: a package
    that is installed but breaks on import (timm without a torchvision for this torch) is missing
    too, and the run is going to import it anyway."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        return (
            "not installed"
            if e.name == module.split(".")[0] or sys.modules.get(module, 0) is None
            else str(e)
        )
    except Exception as e:  # noqa: BLE001 - any failure on import means it cannot be used
        return f"{type(e).__name__}: {e}"
    return None


def available(module: str) -> bool:
    return import_problem(module) is None


def require(module: str, feature: str, package: str, *, in_extra: bool = True) -> None:
    """ConfigError naming ``feature`` and what to install, if ``module`` cannot be imported."""
    problem = import_problem(module)
    if problem is not None:
        how = f"{INSTALL} (or pip install {package})" if in_extra else f"pip install {package}"
        what = (
            "which is not installed" if problem == "not installed" else f"which fails to import ({problem})"
        )
        raise ConfigError(f"fastops.train: {feature} needs {package}, {what}: {how}")


def optional(module: str, feature: str, package: str, *, notify: bool = True) -> bool:
    """Whether ``module`` is there; if not (and ``notify``), one line on stderr saying what is skipped."""
    if available(module):
        return True
    if notify:
        print(f"fastops.train: {package} is not installed, so {feature} ({INSTALL})", file=sys.stderr)
    return False
