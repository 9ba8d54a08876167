"""The pure core is the import contract of pyproject.toml ([tool.importlinter], run by ``make test``), kept whole.

The contract's sources are the package ``app.domain`` (a module is pure by being put there) and ``app.web.views``.
These tests keep it honest from two sides: every module of ``app/`` whose docstring claims purity is in the contract (a
new pure module cannot be forgotten), and each module of it, found in its folder and imported alone, loads no I/O
library at run time (what a static import graph cannot see: ``importlib``, ``__import__``).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
(PURE_CORE,) = (contract for contract in CONTRACTS if contract["id"] == "pure-core")
PURE = tuple(PURE_CORE["source_modules"])
DOMAIN = "app.domain"

# The I/O libraries loaded at run time: the contract's external packages and the stdlib's I/O modules it cannot name
# (import-linter takes no subpackage of an external package, and ``urllib.parse`` or ``http.HTTPStatus`` are pure).
IO = (
    *(name for name in PURE_CORE["forbidden_modules"] if not name.startswith("app.")),
    "urllib.request",
    "http.client",
)

# How a module's docstring claims purity: "Pure.", "Pure: no I/O", "No I/O", "...: pure parsing", "pure functions from",
# or "(pure)" in its first line (further down, "(pure)" is said of another module: app.engine.repair's policy).
CLAIM = re.compile(r"\bPure\b|\bNo I/O\b|: pure\b|\bpure functions from\b|\A[^\n]*\(pure\)")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _claims_purity(path: Path) -> bool:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return bool(CLAIM.search(docstring))


def _covered(module: str) -> bool:
    return any(module == source or module.startswith(source + ".") for source in PURE)


def _modules(source: str) -> list[str]:
    """The modules of a contract source: itself, and for a package every module in its folder."""
    path = ROOT / Path(*source.split("."))
    if not path.is_dir():
        return [source]
    return sorted(_module_name(module) for module in path.rglob("*.py"))


# Every module of the pure core, found in the folders of its packages (app/domain/): what is put there is checked.
MODULES = tuple(module for source in PURE for module in _modules(source))


def test_every_module_that_claims_purity_is_in_the_contract() -> None:
    claimed = sorted(_module_name(path) for path in (ROOT / "app").rglob("*.py") if _claims_purity(path))
    assert (
        "app.domain.paging" in claimed and "app.domain.hostlist" in claimed
    )  # the claim's pattern finds what it must
    missing = [module for module in claimed if not _covered(module)]
    assert not missing, (
        f"docstrings claim purity, but these are outside app/domain/ (the pure-core contract): {missing}"
    )


def test_the_contract_names_modules_that_exist() -> None:
    assert DOMAIN in PURE, "app/domain/ is the pure core's folder: the pure-core contract must name it"
    assert f"{DOMAIN}.incident_policy" in MODULES  # the folder's modules are found
    for module in PURE:
        path = ROOT / Path(*module.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), module


@pytest.mark.parametrize("module", MODULES)
def test_a_pure_module_loads_no_io_library(module: str) -> None:
    # A module inside an impure package (app.web.views in app.web, which is Flask's) is judged on what it adds itself.
    parent = module.rpartition(".")[0]
    preload = f"import {parent}; " if parent != "app" and not _covered(parent) else ""
    code = (
        f"import sys; {preload}before = set(sys.modules); import {module}; "
        f"bad = [m for m in {IO!r} if m in sys.modules and m not in before]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_strict_on_exactly_the_pure_core() -> None:
    """mypy's strict list and the pure-core contract name the same modules (a package of the core with its
    submodules), so neither can grow without the other."""
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    (strict,) = [o for o in overrides if o.get("disallow_untyped_defs")]
    listed = set(strict["module"])
    packages = {m for m in PURE if (ROOT / m.replace(".", "/")).is_dir()}
    assert {m.removesuffix(".*") for m in listed} == set(PURE)
    assert {m.removesuffix(".*") for m in listed if m.endswith(".*")} == packages
