"""Regenerate the error catalogue of docs/troubleshooting.md from the package source.

    python docs/make_troubleshooting.py          # rewrite the catalogue
    python docs/make_troubleshooting.py --check  # exit 1 if the file is out of date (the tests run this)

Every `raise SomeError("...")` (and OTBConfig's `_fail("...")`) in trl_otb/ and its sub-packages is listed with
its message; `{...}` marks the parts filled in at run time. The messages themselves say what to change.
trl_otb.testing (the test suite's helpers and CPU switches) is left out: a user never meets its errors.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "troubleshooting.md"
BEGIN, END = "<!-- BEGIN GENERATED CATALOGUE -->", "<!-- END GENERATED CATALOGUE -->"


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None and right is None else (left or "{...}") + (right or "{...}")
    if isinstance(node, ast.Call) and node.args:  # e.g. _unavailable_message(path)
        return None
    return None


def messages() -> list[tuple[str, str, str]]:
    """(module, exception, message) for every raise with a literal message, in source order."""
    found = []
    for path in sorted((ROOT / "trl_otb").rglob("*.py")):
        if path.is_relative_to(ROOT / "trl_otb" / "testing"):
            continue
        module = ".".join(path.relative_to(ROOT / "trl_otb").with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            call = None
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                call, kind = node.exc, getattr(node.exc.func, "id", getattr(node.exc.func, "attr", "?"))
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("fail", "_fail"):
                call, kind = node, "ValueError (OTBConfig)"
            if call is None or not call.args:
                continue
            text = _text(call.args[0])
            if text:
                found.append((node.lineno, module, kind, " ".join(text.split())))
    return [(module, kind, text) for _, module, kind, text in sorted(found, key=lambda x: (x[1], x[0]))]


def catalogue() -> str:
    lines = [BEGIN, ""]
    current = None
    for module, kind, text in messages():
        if module != current:
            lines += ["", f"### `trl_otb.{module}`", ""]
            current = module
        lines.append(f"- **{kind}**: {text.replace('|', '/')}")
    lines += ["", END]
    return "\n".join(lines)


def render(existing: str) -> str:
    head, _, rest = existing.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + catalogue() + tail


if __name__ == "__main__":
    current = DOC.read_text()
    updated = render(current)
    if "--check" in sys.argv:
        if updated != current:
            print("docs/troubleshooting.md is out of date: run `python docs/make_troubleshooting.py`.")
            sys.exit(1)
    else:
        DOC.write_text(updated)
