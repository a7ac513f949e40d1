"""Hostile YAML costs nothing (preprocessing/toolbox/config_files.py): alias bombs, merge
keys, recursive anchors, deep nesting, huge scalars and unsafe tags are parsed or refused
in bounded time and memory, and the refusal names the file (or the `--set`) and the line,
never the expanded document."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from flows.cli.main import apply_override
from preprocessing.config import ReshardConfig
from preprocessing.toolbox.config_files import (
    MAX_NODES,
    ConfigFileError,
    load_config,
    parse_yaml_value,
)

MAX_PARSE_S = 2.0
MAX_PARSE_BYTES = 100 << 20


def alias_bomb(levels: int, width: int, merge: bool = False) -> str:
    """The billion laughs: each level a list (or merged mappings) of `width` aliases of the
    level below; `width ** levels` leaves once expanded, from a few hundred bytes."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels + 1):
        if merge:
            keys = ", ".join(f"k{i}: *a{level - 1}" for i in range(width))
            lines.append(f"a{level}: &a{level} {{<<: *a0m, {keys}}}")
        else:
            lines.append(f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * width)}]")
    if merge:
        lines.insert(0, "a0m: &a0m {x: 1}")
    return "\n".join(lines) + "\n"


def test_the_issues_alias_bomb_is_refused_at_once_naming_file_and_line(tmp_path: Path) -> None:
    """Invariant: the 1 KB bomb that took 2.4-3.0 GiB and over 60 s is a ConfigFileError
    naming the file, the limit and the line of the alias that crossed it, within 2 s of
    CPU."""
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(levels=9, width=9))
    assert path.stat().st_size < 1024
    started = time.process_time()
    with pytest.raises(ConfigFileError) as caught:
        load_config(ReshardConfig, path)
    assert time.process_time() - started < MAX_PARSE_S
    message = str(caught.value)
    assert message.startswith(f"config {path}: not valid YAML (more than {MAX_NODES} nodes")
    assert "at line " in message and "lol" not in message and "\n" not in message


def test_a_recursive_alias_and_an_unsafe_tag_are_refused_with_their_line() -> None:
    """Invariant: an alias inside its own anchor and a python tag are refused, naming the
    origin and the line; the tag's code never runs."""
    with pytest.raises(ConfigFileError, match=r"^c: .*recursive.* at line 2"):
        parse_yaml_value("a: 1\nb: &x [1, *x]\n", "c")
    with pytest.raises(ConfigFileError, match=r"^c: .*python/object/apply:os.system.* line 1"):
        parse_yaml_value("x: !!python/object/apply:os.system ['touch /tmp/pwned']\n", "c")


def test_a_set_value_goes_through_the_same_bounds_and_is_named() -> None:
    """Invariant: `--set KEY=VALUE` of `ballast run` parses VALUE under the config's bounds
    and its refusal names the `--set`; a plain value still sets the field."""
    values: dict[str, object] = {}
    apply_override(values, "train.max_epochs=3")
    assert values == {"train": {"max_epochs": 3}}
    levels = ["&l0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"&l{n} [" + ", ".join([f"*l{n - 1}"] * 9) + "]" for n in range(1, 9)]
    bomb = "[" + ", ".join(levels) + "]"  # one line, as the issue's 532-character --set
    with pytest.raises(ConfigFileError, match=r"^--set reshard\.dataset: not valid YAML"):
        apply_override(values, f"reshard.dataset={bomb}")


def test_shared_values_within_the_bounds_still_load(tmp_path: Path) -> None:
    """Invariant: anchors and merge keys a real config uses load as before."""
    path = tmp_path / "reshard.yaml"
    path.write_text(
        "defaults: &d {inputs: [/data/raw]}\ndataset: {<<: *d}\noutput_root: /data/out\n"
    )
    with pytest.raises(ValidationError, match="defaults"):  # unknown top-level field
        load_config(ReshardConfig, path)
    assert parse_yaml_value(path.read_text(), "c")["dataset"] == {"inputs": ["/data/raw"]}


def documents() -> st.SearchStrategy[str]:
    """Generated hostile documents: alias bombs (lists or merge keys), nesting by brackets
    or indentation, huge scalars, tags safe and unsafe, and plain mappings."""
    bombs = st.builds(alias_bomb, st.integers(1, 12), st.integers(1, 16), st.booleans())
    brackets = st.integers(1, 400).map(lambda depth: "x: " + "[" * depth + "]" * depth)
    indented = st.integers(1, 120).map(
        lambda depth: "".join(f"{' ' * level}k{level}:\n" for level in range(depth)) + "v"
    )
    huge = st.sampled_from(["x: '{}'\n", "x: {}\n", 'x: "{}"\n', "x: |\n  {}\n"]).flatmap(
        lambda template: st.integers(1, 1 << 20).map(lambda n: template.format("y" * n))
    )
    tags = st.sampled_from(
        [
            "!!python/object/apply:os.system ['true']",
            "!!binary aGVsbG8=",
            "!custom {a: 1}",
            "!!set {a, b}",
            "!!timestamp 2026-01-01",
            "!!python/name:os.system",
            "!!str 3",
            "!!omap [a: 1]",
        ]
    )
    tagged = tags.map(lambda tag: f"x: {tag}\n")
    wide = st.integers(1, 200_000).map(lambda n: "x: [" + ",".join(["0"] * n) + "]\n")
    return st.one_of(bombs, brackets, indented, huge, tagged, wide)


@example("x: [" + ",".join(["0"] * 200_000) + "]\n")  # the most nodes 1 MiB holds
@example("x: '" + "y" * ((1 << 20) - 8) + "'\n")  # the largest scalar
@example(alias_bomb(levels=12, width=16, merge=True))
@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(documents())
def test_any_generated_document_parses_in_bounded_time_and_memory(text: str) -> None:
    """Invariant: every generated document is parsed or refused (ConfigFileError) within
    2 s of CPU (this process's; wall time on a shared host measures the neighbours) and
    100 MB of Python allocations, measured on separate parses (tracemalloc slows the one
    it watches)."""
    started = time.process_time()
    outcome = _parse(text)
    elapsed = time.process_time() - started
    tracemalloc.start()
    try:
        _parse(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < MAX_PARSE_S, f"{elapsed:.2f} s ({outcome})"
    assert peak < MAX_PARSE_BYTES, f"{peak / 1e6:.0f} MB ({outcome})"


def _parse(text: str) -> str:
    try:
        parse_yaml_value(text, "generated")
    except ConfigFileError as error:
        return str(error)
    return "parsed"
