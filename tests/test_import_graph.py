"""The package has no import cycles, counting TYPE_CHECKING and function-local imports.

Builds the graph of every ``import`` statement in ``src/envrunners`` (found with
``ast`` anywhere in a module, so imports inside functions and behind
``TYPE_CHECKING`` count too) and fails on any strongly connected component that is
not on the short allow-list below. A cycle is allowed only where RLlib's public API
forces one; each entry says why.

The same scan checks that ``envrunners.rllib`` (the plug-in runners for RLlib's own
algorithms) is the only part of the package that imports ``ray.rllib``: where the
``rllib`` extra is installed a stray import would succeed silently, and the rest of
the package must keep working without RLlib.
"""

from __future__ import annotations

import ast
from pathlib import Path

import envrunners

PACKAGE_DIR = Path(envrunners.__file__).parent

#: Cycles RLlib's API forces, each a frozenset of module names, with the reason.
ALLOWED_CYCLES: dict[frozenset[str], str] = {
    frozenset(
        {
            "envrunners.core.rl_module.rl_module",
            "envrunners.core.rl_module.multi_rl_module",
        }
    ): "RLModule.as_multi_rl_module() / RLModuleSpec.as_multi_rl_module_spec() return their "
    "containers (RLlib API); MultiRLModule subclasses RLModule",
}


def _module_names(package_dir: Path) -> dict[str, tuple[Path, bool]]:
    """``{dotted module name: (path, is_package)}`` for every module of the package."""
    modules = {}
    for path in package_dir.rglob("*.py"):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


def _known_prefix(name: str, modules: dict) -> str | None:
    """The longest prefix of ``name`` that is a module of the package (or None)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, every import statement counted."""
    modules = _module_names(package_dir)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # ``from pkg import submodule`` imports the submodule; ``from pkg
                # import name`` the module (or package ``__init__``) that defines it.
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                    for alias in node.names
                ]
            for target in targets:
                found = _known_prefix(target, modules)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def ray_rllib_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import of ``ray.rllib`` in the file at ``path``.

    Counts ``import ray.rllib...``, ``from ray.rllib... import``, ``from ray import
    rllib`` and ``importlib.import_module("ray.rllib...")`` / ``__import__`` with a
    literal name, anywhere in the module (functions and ``TYPE_CHECKING`` included).
    """

    def is_rllib(name: str) -> bool:
        return name == "ray.rllib" or name.startswith("ray.rllib.")

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if called in ("import_module", "__import__") and isinstance(first, ast.Constant):
                names = [str(first.value)]
        hits = [name for name in names if is_rllib(name)]
        if hits:
            found.append((node.lineno, hits[0]))
    return found


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_cycle_finder_finds_a_cycle_and_ignores_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_graph_sees_function_local_relative_and_type_checking_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n"
    )
    (package / "sub" / "c.py").write_text("import pkg.sub.b\nfrom . import b\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.a"}
    assert graph["pkg.sub.c"] == {"pkg.sub.b"}
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.sub.b"})]


def test_no_import_cycles_beyond_the_allow_list():
    found = cycles(import_graph())
    unexpected = [sorted(c) for c in found if c not in ALLOWED_CYCLES]
    assert not unexpected, "import cycles (break them, or allow-list with a reason): " + "; ".join(
        " <-> ".join(c) for c in unexpected
    )


def test_allow_list_has_no_stale_entries():
    found = set(cycles(import_graph()))
    stale = [sorted(c) for c in ALLOWED_CYCLES if c not in found]
    assert not stale, f"allow-listed cycles that no longer exist: {stale}"


def test_ray_rllib_import_finder_sees_every_form(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "import ray\n"
        "from ray import tune\n"
        "import ray.rllib.algorithms\n"
        "from ray.rllib.env import SingleAgentEnvRunner\n"
        "from ray import rllib\n"
        "def f():\n"
        "    import importlib\n"
        "    return importlib.import_module('ray.rllib.core')\n"
    )
    assert [line for line, _ in ray_rllib_imports(path)] == [3, 4, 5, 8]


def test_only_envrunners_rllib_imports_ray_rllib():
    offenders = [
        f"{name} (line {line}: {target})"
        for name, (path, _) in sorted(_module_names(PACKAGE_DIR).items())
        if name != "envrunners.rllib" and not name.startswith("envrunners.rllib.")
        for line, target in ray_rllib_imports(path)
    ]
    assert not offenders, (
        "only envrunners.rllib may import ray.rllib (the rest of the package runs without "
        "the rllib extra): " + "; ".join(offenders)
    )
