"""The C++ error messages format numbers through fastops::str (csrc/include/fastops/checks.h), never by
streaming them into TORCH_CHECK: on the GPU image (torch 2.11, libstdc++ pieces linked into the
extension) iostream's numeric formatting inside the extension crashes the process. The H200 run of
2026-11-27 lost fused_adam_'s "share memory" error to exactly that: a host SIGSEGV instead of the
RuntimeError. A source scan, so the rule holds on machines where streaming happens to work."""

from __future__ import annotations

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parent.parent / "csrc"
# TORCH_CHECK and our typed checks (fastops/checks.h: FASTOPS_CHECK_SHAPE, _DTYPE, _ARG), which take
# their message pieces the same way.
CHECK = re.compile(r"\b(TORCH_CHECK\w*|TORCH_INTERNAL_ASSERT|FASTOPS_CHECK\w*)\s*\(")
# What a message piece may be: string literals, fastops::str / std::string / c10::toString calls,
# a choice between literals, or one of the const char* parameters our checks pass around.
LITERALS = r'(?:"(?:[^"\\]|\\.)*"\s*)+'
SAFE = re.compile(
    rf"{LITERALS}|(?:str|std::string|c10::toString)\(.*\)|[^?]+\?\s*{LITERALS}:\s*{LITERALS}"
    r"|op|arg|ref_arg|x_arg|name|what"
)


def _call_args(src: str, start: int) -> tuple[list[str], int]:
    """The top-level arguments of the call whose '(' ends at ``start``, and where the call ends."""
    args, depth, cur, i, in_string = [], 1, "", start, False
    while depth:
        c = src[i]
        if in_string:
            cur += c
            if c == "\\":
                cur += src[i + 1]
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string, cur = True, cur + c
        elif c in "([{":
            depth, cur = depth + 1, cur + c
        elif c in ")]}":
            depth -= 1
            if depth:
                cur += c
        elif c == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
        else:
            cur += c
        i += 1
    args.append(cur.strip())
    return args, i


def _unsafe_pieces(src: str) -> list[tuple[int, str]]:
    found = []
    for m in CHECK.finditer(src):
        if src[src.rfind("\n", 0, m.start()) + 1 : m.start()].lstrip().startswith("#define"):
            continue  # a check's own definition, not a call
        args, _ = _call_args(src, m.end())
        line = src.count("\n", 0, m.start()) + 1
        found += [(line, a) for a in args[1:] if not SAFE.fullmatch(a)]
    return found


def test_check_messages_format_numbers_through_str() -> None:
    files = [p for p in sorted(CSRC.rglob("*")) if p.suffix in {".cpp", ".cu", ".h", ".cuh"}]
    assert len(files) > 20
    unsafe = [
        f"{p.relative_to(CSRC)}:{line}: {piece}"
        for p in files
        for line, piece in _unsafe_pieces(p.read_text())
    ]
    assert not unsafe, (
        "message pieces streamed into TORCH_CHECK (wrap numbers in fastops::str):\n" + "\n".join(unsafe)
    )


def test_the_scan_sees_a_streamed_number() -> None:
    """The scan itself: a size_t streamed in is caught, its str() form and string pieces are not."""
    bad = 'TORCH_CHECK(a < b, "fastops.op: params[", i, "] and ", arg, "[", std::min(i, j), "]");'
    good = 'TORCH_CHECK(a < b, "fastops.op: params[", str(static_cast<int64_t>(i)), "] of ", op, cpu ? " (x)" : "");'
    assert [piece for _, piece in _unsafe_pieces(bad)] == ["i", "std::min(i, j)"]
    assert _unsafe_pieces(good) == []
    typed = 'FASTOPS_CHECK_SHAPE(x.dim() == 4, "fastops.", op, ": got ", x.dim());'
    assert [piece for _, piece in _unsafe_pieces(typed)] == ["x.dim()"]
    definition = "#define FASTOPS_CHECK_ARG(cond, ...) \\\n  do { } while (false)"
    assert _unsafe_pieces(definition) == []
