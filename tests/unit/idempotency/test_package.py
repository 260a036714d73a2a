"""The package's exports: loaded on first use, and always the definitions, never modules."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import subprocess
import sys

import jobs_platform.idempotency as idempotency


def test_every_export_is_its_definition_even_after_all_submodules_loaded() -> None:
    # Importing a submodule binds it on the package: a module named like an export (the
    # old ``transition`` module) would then shadow the export it was loaded for.
    for module in pkgutil.iter_modules(idempotency.__path__):
        importlib.import_module(f"{idempotency.__name__}.{module.name}")
    from jobs_platform.idempotency import transition

    assert inspect.isfunction(transition) and transition.__name__ == "transition"
    for name in idempotency.__all__:
        value = getattr(idempotency, name)
        assert not inspect.ismodule(value), name
        assert value.__name__ == name


def test_importing_the_package_and_unique_loads_no_sqlalchemy() -> None:
    # jobs_platform.task needs only ``unique`` (Redis). The parent package is stood in for,
    # so that only this package's own imports are measured.
    spec = importlib.util.find_spec("jobs_platform")
    assert spec is not None and spec.submodule_search_locations is not None
    script = f"""
import sys, types
parent = types.ModuleType("jobs_platform")
parent.__path__ = {list(spec.submodule_search_locations)!r}
sys.modules["jobs_platform"] = parent
from jobs_platform.idempotency import unique, business_identity
print(sorted({{m.split(".")[0] for m in sys.modules}} & {{"sqlalchemy", "alembic"}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
