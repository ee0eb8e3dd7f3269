"""`python -m fastops.info`: what is installed and compiled, for bug reports."""

from __future__ import annotations

import os
import platform
import sys

import torch


def _op_devices() -> dict[str, list[str]]:
    """Each fastops op (forward ops and their backward twins) with the devices that have a kernel."""
    ops: dict[str, list[str]] = {}
    # The dispatcher's registry, not dir(torch.ops.fastops): that lists only ops already looked up.
    registered = {
        qualified.split("::", 1)[1].split(".", 1)[0]
        for qualified in torch._C._dispatch_get_all_op_names()
        if qualified.startswith("fastops::")
    }
    for name in sorted(registered):
        if name.startswith("_"):
            continue
        try:
            packet = getattr(torch.ops.fastops, name)
            overload = packet.default
        except (AttributeError, RuntimeError):
            continue
        devices = [
            key.lower()
            for key in ("CPU", "CUDA")
            if torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), key)
        ]
        ops[name] = devices
    return ops


def report() -> str:
    import fastops
    from fastops import _extension

    ext = _extension.load()
    lines = [
        f"fastops {fastops.__version__}",
        f"  build: {ext.mode} ({ext.path})",
        # Side by side, so a report shows at once whether the library was built for this torch.
        f"  compiled against torch {ext.built_for_torch or 'unknown (not recorded)'}, running torch "
        f"{torch.__version__}",
        # The level that runs is chosen at load (the best this CPU supports, or FASTOPS_CPU_CAPABILITY).
        f"  CPU kernels: {ext.cpu_capability} ISA level running (built: "
        f"{', '.join(ext.cpu_capabilities_built) or 'unknown'}); torch CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads",
    ]
    if ext.with_cuda:
        archs = ext.details.get("cuda_archs", "unknown")
        arch_list = ", ".join(f"sm_{int(a) // 10}{int(a) % 10}" for a in archs.split(",") if a.isdigit())
        runtime = int(ext.details.get("cuda_runtime", "0"))
        lines.append(
            f"  CUDA kernels: compiled in, archs {arch_list or archs}, CUDA runtime "
            f"{runtime // 1000}.{runtime % 1000 // 10}"
        )
    else:
        lines.append("  CUDA kernels: not compiled in")
    lines += [
        f"python {platform.python_version()} ({sys.executable})",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
        f"{torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}",
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            lines.append(f"  cuda:{i} {torch.cuda.get_device_name(i)} (sm_{cap[0]}{cap[1]})")
    else:
        lines.append("  no CUDA device visible")
    lines.append("ops (torch.ops.fastops.<name>: devices with a kernel):")
    for name, devices in _op_devices().items():
        lines.append(f"  {name:32s} {', '.join(devices) or 'none'}")
    from fastops import policy, tuner

    override = os.environ.get(policy.BACKEND_ENV)
    tuning = "on" if tuner.tuning_enabled() else f"off ({tuner.TUNE_ENV}=0)"
    lines.append(
        "kernel choice: modules time fastops' kernel against PyTorch's per kind of input on this machine "
        f"and keep the faster; tuning {tuning}"
        + (f"; {policy.BACKEND_ENV}={override} overrides it" if override else "")
    )
    choices = tuner.describe()
    lines += [f"  {line}" for line in choices] or ["  no choice cached for this machine and build yet"]
    return "\n".join(lines)


def main() -> None:
    print(report())


if __name__ == "__main__":
    main()
