"""The dependency rule of docs/architecture.md, checked on the code itself.

Each package imports only the packages its row of the table allows, and no
modules anywhere import each other in a circle. Imports inside functions
count too: a lazy import that closes a circle is still a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "recording", "proxy", "analytics", "replay", "harness", "scenarios", "kafkatap")

# package -> the packages of ours it may import (docs/architecture.md, "The dependency rule")
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "recording": {"protocol"},
    "proxy": {"protocol", "recording"},
    "analytics": {"recording", "protocol"},
    "harness": {"protocol"},
    "replay": {"protocol", "recording", "harness", "proxy"},
    "scenarios": {"protocol", "recording", "proxy", "analytics", "replay", "harness", "kafkatap"},
    "kafkatap": {"protocol", "recording", "proxy", "analytics", "replay", "harness", "scenarios"},
}
# where a package may use only some modules of another: analytics reads Kafka's vocabulary, never the codec
ONLY_MODULES: dict[tuple[str, str], set[str]] = {("analytics", "protocol"): {"protocol.error_kinds", "protocol.api_keys"}}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files() -> dict[str, Path]:
    return {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The modules `path` imports: `from a import b` is `a.b` when that is a module, else `a`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{path}: relative import"
            for a in node.names:
                full = f"{node.module}.{a.name}"
                names.add(full if full in modules else node.module)
    return names


def test_the_table_names_every_package():
    found = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert found == set(PACKAGES) == set(ALLOWED)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_the_rule_allows(package):
    files = _files()
    bad = []
    for mod, path in files.items():
        if mod.split(".")[0] != package:
            continue
        imported = _imports(path, set(files))
        ours = {n.split(".")[0] for n in imported} & set(PACKAGES)
        extra = ours - ALLOWED[package] - {package}
        if extra:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(extra)}")
        for (importer, target), allowed in ONLY_MODULES.items():
            beyond = {n for n in imported if n.split(".")[0] == target} - allowed if importer == package else set()
            if beyond:
                bad.append(f"{path.relative_to(ROOT)} imports {sorted(beyond)}; {package} may use only {sorted(allowed)} of {target}")
    assert not bad, "\n".join(bad)


def test_no_import_circle_anywhere():
    files = _files()
    modules = set(files)

    def resolve(name: str) -> str | None:
        while name and name not in modules:  # `from a.b import c` where c is a function: the module a.b
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        targets = {resolve(n) for n in _imports(path, modules)} - {None, mod}
        # a package's __init__ importing its own submodules is how it exposes them, not a circle
        graph[mod] = {t for t in targets if not t.startswith(mod + ".")}  # type: ignore[union-attr]
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            assert state.get(n) != 1, "import circle: " + " -> ".join(path[path.index(n):] + [n])
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert {"proxy.connection", "proxy.server", "analytics.job", "replay.engine"} <= graph.keys()
