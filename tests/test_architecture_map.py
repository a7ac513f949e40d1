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
    return text[start : text.index("\n## 5.", start)]


def modules() -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    )


def named_modules() -> set[str]:
    return set(
        re.findall(r"`((?:flows|preprocessing|training|tracking)/[a-z_/]+\.py)`", section_4())
    )


def test_every_module_has_a_home_in_the_map() -> None:
    named = named_modules()
    missing = [module for module in modules() if module not in named]
    assert not missing, f"modules without a row in docs/architecture.md section 4: {missing}"


def test_the_map_names_only_modules_that_exist() -> None:
    named = named_modules()
    assert named, "section 4 names no module"
    assert sorted(named - set(modules())) == []


MAX_LINES = 250


def drawing() -> list[str]:
    """The folders of section 1's drawing in reading order, each as a dotted package name
    (an indented folder is a room of the unindented one above it)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## 1. Layers and rooms") :].split("```")[1]
    names, top = [], ""
    for line in block.splitlines():
        match = re.match(r"( *)([a-z_]+)/ ", line + " ")
        if not match:
            continue
        if match.group(1):
            names.append(f"{top}.{match.group(2)}")
        else:
            top = match.group(2)
            names.append(top)
    return names


def layer_contracts() -> list[list[str]]:
    """The layers of every import-linter `layers` contract that are packages (folders)."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    found = []
    for contract in contracts["contracts"]:
        if contract["type"] == "layers":
            packages = [
                layer for layer in contract["layers"] if (ROOT / layer.replace(".", "/")).is_dir()
            ]
            found.append(packages)
    return found


def test_the_map_is_short() -> None:
    lines = (ROOT / "docs" / "architecture.md").read_text().count("\n")
    assert lines <= MAX_LINES, f"docs/architecture.md has {lines} lines (at most {MAX_LINES})"


def test_the_drawing_orders_every_layered_package_as_the_contracts_do() -> None:
    """Invariant: every package of a `layers` contract is drawn in section 1, above the
    layers it may import, so the picture a newcomer reads is the rule lint-imports keeps."""
    drawn = drawing()
    contracts = layer_contracts()
    assert len(contracts) >= 3 and drawn[:1] == ["flows"]
    for layers in contracts:
        missing = [layer for layer in layers if layer not in drawn]
        assert not missing, f"layers {missing} of a contract are not drawn in section 1"
        positions = [drawn.index(layer) for layer in layers]
        assert positions == sorted(positions), f"section 1 draws {layers} out of order"
