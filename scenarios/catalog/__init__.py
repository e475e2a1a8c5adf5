"""The incident catalog (docs/incidents.md): one module per scenario, each defining `SCENARIO`.

Copy a module, change the broker properties, clients or faults, and run it
with `kafkatap scenario run FILE.py`. `all_scenarios()` lists the built-in
ones in incident order.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from scenarios.spec import Scenario

MODULES = ["batch_too_large", "idle_firewall", "who_is_writing", "connection_surge", "no_window_scaling",
           "middlebox_latency", "leader_moves", "coordinator_lost"]


def all_scenarios() -> list[Scenario]:
    """Every built-in scenario (a module that fails to import is reported, not hidden)."""
    return [importlib.import_module(f"scenarios.catalog.{m}").SCENARIO for m in MODULES]


def _where_in(name: str, exc: BaseException) -> str:
    """`FILE:LINE` of the deepest frame of `exc` inside the scenario file `name` (a syntax error's own line)."""
    import traceback

    if isinstance(exc, SyntaxError) and exc.lineno:
        return f"{name}:{exc.lineno}"
    target = Path(name).resolve()
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == target]
    return f"{name}:{lines[-1]}" if lines else name


def get(name: str) -> Scenario:
    """A built-in scenario by name (batch-too-large) or a path to a module defining SCENARIO."""
    known = ", ".join(m.replace("_", "-") for m in MODULES)
    if name.endswith(".py"):
        if not Path(name).is_file():
            raise KeyError(f"{name}: no such file (a scenario of your own is a Python file defining SCENARIO; "
                           f"the built-in ones: {known})")
        spec = importlib.util.spec_from_file_location(f"scenario_{Path(name).stem}", name)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:  # noqa: BLE001 — the operator's own code: where it failed, in one line
            raise KeyError(f"{_where_in(name, exc)}: {type(exc).__name__}: {exc}") from None
        found = getattr(mod, "SCENARIO", None)
        if not isinstance(found, Scenario):
            raise KeyError(f"{name} defines no SCENARIO = Scenario(...) (scenarios.spec); copy a module of "
                           "scenarios/catalog/ to start from")
        from scenarios.validate import spec_problems

        problems = spec_problems(found)
        if problems:
            raise KeyError(f"{name}: " + "; ".join(problems))
        return found
    mod_name = name.replace("-", "_")
    if mod_name not in MODULES:
        raise KeyError(f"unknown scenario {name!r}; known: {known}")
    return importlib.import_module(f"scenarios.catalog.{mod_name}").SCENARIO
