"""The map in docs/architecture.md section 4 names every module of the four packages, so
a newcomer finds the home of a change from the doc, and a module added without a home
there fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "preprocessing", "training", "tracking")


def section_4() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## 4. Where each concern lives")
    return text[start:text.index("\n## 5.", start)]


def modules() -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for package in PACKAGES
                  for path in (ROOT / package).rglob("*.py") if path.name != "__init__.py")


def named_modules() -> set[str]:
    return set(re.findall(r"`((?:flows|preprocessing|training|tracking)/[a-z_/]+\.py)`",
                          section_4()))


def test_every_module_has_a_home_in_the_map() -> None:
    named = named_modules()
    missing = [module for module in modules() if module not in named]
    assert not missing, f"modules without a row in docs/architecture.md section 4: {missing}"


def test_the_map_names_only_modules_that_exist() -> None:
    named = named_modules()
    assert named, "section 4 names no module"
    assert sorted(named - set(modules())) == []
