"""The house rules of the layout (DESIGN.md): checked, not hoped.

- every exception class is defined in ``envrunners.errors``;
- no module explains its existence by size;
- no private module is named ``_parts``/``_side``/``_common``/``_api``;
- ``docs/layout.md``, the map of the house, lists every source file once.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import envrunners

PACKAGE_DIR = Path(envrunners.__file__).parent
LAYOUT_DOC = Path(__file__).resolve().parents[1] / "docs" / "layout.md"


def _source_files() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def _first_docstring_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def test_every_exception_class_lives_in_errors():
    misplaced = []
    for info in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="envrunners."):
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as err:  # an optional extra that is not installed
            if err.name and err.name.split(".")[0] in {"envrunners"}:
                raise
            continue
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and module.__name__ != "envrunners.errors"
            ):
                misplaced.append(f"{module.__name__}.{name}")
    assert not misplaced, f"exception classes outside envrunners/errors.py: {misplaced}"


def test_no_module_explains_itself_by_size():
    pattern = re.compile(
        r"(stays?|keeps?|remains?|reads?)\s+(short|small)|under \d+ lines",
        re.IGNORECASE,
    )
    offenders = [
        str(path.relative_to(PACKAGE_DIR))
        for path in _source_files()
        if pattern.search(ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert not offenders, f"module docstrings that justify the module by its size: {offenders}"


def test_private_module_names_say_what_they_do():
    vague = {"_parts", "_side", "_common", "_api", "_utils", "_misc", "_helpers"}
    offenders = [
        str(path.relative_to(PACKAGE_DIR))
        for path in _source_files()
        if path.stem.startswith("_") and any(path.stem.endswith(v) for v in vague)
    ]
    assert not offenders, f"private modules with names that say nothing: {offenders}"


def test_layout_doc_lists_every_source_file_once():
    text = LAYOUT_DOC.read_text()
    listed = re.findall(r"`(envrunners/[\w/]+\.py)`", text)
    files = {str(p.relative_to(PACKAGE_DIR.parent)) for p in _source_files()}
    # The doc names files by their path under src/, e.g. ``envrunners/env/env_runner.py``.
    missing = sorted(files - set(listed))
    unknown = sorted(set(listed) - files)
    repeated = sorted({f for f in listed if listed.count(f) > 1})
    hint = "\n".join(f"- `{f}`: {_first_docstring_line(PACKAGE_DIR.parent / f)}" for f in missing)
    assert not missing, f"docs/layout.md does not list:\n{hint}"
    assert not unknown, f"docs/layout.md lists files that do not exist: {unknown}"
    assert not repeated, f"docs/layout.md lists files more than once: {repeated}"
