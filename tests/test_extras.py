"""Each package's extra installs what the package imports: every third-party module that a
package (or a ballast package it imports) imports at any depth is a distribution in the
closure of that package's extra in pyproject.toml, so `pip install 'ballast[tracking]'`
gives a `tracking` that imports. Optional backends imported inside the one function that
needs them are named with the extra that brings them (OPTIONAL)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWN = ("flows", "preprocessing", "training", "tracking")
EXTRA_OF = {"preprocessing": None, "training": "training", "tracking": "tracking", "flows": "flows"}
# A module imported only where its backend is chosen, and the extra that installs it.
OPTIONAL = {
    "dask_jobqueue": "slurm",
    "dask_kubernetes": "kubernetes",
    "kubernetes": "kubernetes",
    "s3fs": "s3",
    "botocore": "s3",
    "deltalake": "all",
}
# Modules that ship inside a declared requirement (its core, or the extra it is named with).
SHIPPED_WITH = {"distributed": "dask", "pydantic_core": "pydantic"}


@cache
def imported_modules(package: str) -> frozenset[str]:
    """The top-level names every module of `package` imports (at any depth of the file)."""
    names: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return frozenset(names)


def reach(package: str) -> set[str]:
    """`package` and every ballast package it imports, transitively."""
    seen, todo = set(), [package]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo += [name for name in imported_modules(current) if name in OWN]
    return seen


@cache
def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def closure(extra: str | None) -> set[str]:
    """The distributions that `pip install ballast[extra]` brings (names, no versions)."""
    requirements = list(project()["dependencies"])
    extras, todo = set(), [extra] if extra else []
    while todo:
        name = todo.pop()
        if name in extras:
            continue
        extras.add(name)
        for requirement in project()["optional-dependencies"][name]:
            if requirement_name(requirement) == "ballast":
                todo += re.findall(r"[a-z0-9_-]+", requirement.split("[", 1)[1])
            else:
                requirements.append(requirement)
    return {requirement_name(requirement) for requirement in requirements}


@cache
def installed_distributions() -> dict[str, list[str]]:
    return packages_distributions()


def distributions(module: str) -> set[str]:
    """The distribution names that provide `module` (declared directly, never through a
    dependency's dependencies: a module imported is a module declared)."""
    if module in SHIPPED_WITH:
        return {SHIPPED_WITH[module]}
    found = installed_distributions().get(module, [])
    return {name.lower().replace("_", "-") for name in found}


def test_every_import_of_a_package_is_installed_by_its_extra() -> None:
    missing = {}
    for package, extra in EXTRA_OF.items():
        installed = closure(extra)
        for module in set().union(*(imported_modules(own) for own in reach(package))):
            if module in OWN or module in sys.stdlib_module_names:
                continue
            wanted = OPTIONAL.get(module)
            have = installed | (closure(wanted) if wanted else set())
            dists = distributions(module)
            if not dists or not dists & have:
                missing.setdefault(f"{package} (extra {extra})", []).append(module)
    assert not missing, f"imported but not installed by the package's extra: {missing}"


def test_the_check_sees_a_missing_distribution() -> None:
    """The closure is not everything: the plain install has no torch, the training extra
    no mlflow of its own unless it names tracking."""
    assert "torch" not in closure(None) and "torch" in closure("training")
    assert "prefect" in closure("flows") and "prefect" not in closure("tracking")
