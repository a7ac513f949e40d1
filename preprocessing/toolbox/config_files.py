"""Every config file of ballast is read here: YAML from a local path or any fsspec URI
(`s3://bucket/reshard.yaml`), validated into its pydantic model.

A file that is missing, not YAML or not a mapping fails naming the file. A file that does
not validate raises pydantic's ValidationError (so every caller that handles one handles
this), titled with the model and the file, in which an unknown field says more than
"Extra inputs are not permitted":

- a field that moved is refused naming its new place. Each config model declares what
  moved in its own table, `RENAMED: ClassVar[dict[str, str]]`, old field name -> new
  dotted path, both relative to that model (`ReshardConfig.RENAMED["max_chain_length"] ==
  "incremental.max_chain_length"`); a model nested anywhere in the one being loaded (a
  member of a union included) is consulted where it sits, so another module extends the
  refusals by declaring the table on its own model;
- a name close to a known field says "did you mean ...".

A document is parsed under bounds that no config comes near (`parse_yaml_value`): at most
1 MiB, brackets nested at most 100 deep, and at most 10,000 nodes once every alias is
expanded (a recursive alias is refused): a 1 KB document of nested aliases otherwise costs
gigabytes as soon as anything walks it (validation, an error's message). `--set` values
of `ballast run` go through the same bounds.

Lives in the contract room because training/ (TrainConfig, LaunchConfig) loads its configs
through it too.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from fsspec.core import url_to_fs
from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

M = TypeVar("M", bound=BaseModel)
MAX_BYTES = 1 << 20
MAX_DEPTH = 100
MAX_NODES = 10_000


class ConfigFileError(ValueError):
    """A config file that cannot be read as a YAML mapping; the message names the file."""


def read_config_file(
    uri: str | Path, substitutions: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The YAML mapping in `uri` (path or fsspec URI), each `substitutions` key in its text
    replaced by its value first (`${WORK_DIR}`)."""
    fs, path = url_to_fs(str(uri))
    try:
        with fs.open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"config {uri}: no such file") from error
    try:
        text = data.decode()
    except UnicodeDecodeError as error:
        raise ConfigFileError(f"config {uri}: not a text file ({error})") from None
    for key, value in (substitutions or {}).items():
        text = text.replace(key, value)
    return parse_yaml_mapping(text, f"config {uri}")


def parse_yaml_mapping(text: str, origin: str) -> dict[str, Any]:
    """The top-level mapping of a YAML document (empty: {}); `origin` names it in errors."""
    data = parse_yaml_value(text, origin)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(
            f"{origin}: holds a {type(data).__name__}, not a mapping of field names to values"
        )
    return data


def parse_yaml_value(text: str, origin: str) -> Any:
    """The value of a YAML document (safe tags only), within the module's bounds; a
    document past them, or not YAML, raises ConfigFileError naming `origin` and the line,
    never quoting more than the line. Size and nesting are checked before parsing:
    PyYAML's scanner takes minutes on 1e5 nested brackets (found by
    tests/test_fuzz_readers.py)."""
    if problem := _size_problem(text.encode()):
        raise ConfigFileError(f"{origin}: {problem}")
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as error:
        raise ConfigFileError(f"{origin}: not valid YAML ({_one_line(error)})") from None
    except (yaml.YAMLError, RecursionError, ValueError) as error:
        problem = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise ConfigFileError(f"{origin}: not valid YAML ({problem})") from None
    finally:
        loader.dispose()


def _one_line(error: yaml.MarkedYAMLError) -> str:
    """What PyYAML found and where, without its quote of the document."""
    mark = error.problem_mark or error.context_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{error.problem or error.context}{where}"


class _NodeBudget(yaml.composer.Composer):
    """PyYAML's composer counting the nodes of the document as if every alias were
    expanded (an alias adds its anchor's expanded size), stopping past MAX_NODES: aliases
    are shared on load, but whatever walks the result (pydantic, an error's message)
    pays for the expansion."""

    # The parser's, in the class that mixes this in (annotations only: no attribute).
    check_event: Any
    peek_event: Any

    def __init__(self) -> None:
        yaml.composer.Composer.__init__(self)
        self._expanded = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size, once composed

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            anchored = self.anchors.get(event.anchor)
            if anchored is not None and id(anchored) not in self._sizes:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"alias *{event.anchor} inside its own anchor (recursive)",
                    event.start_mark,
                )
            self._count(self._sizes.get(id(anchored), 0), event.start_mark)
            return super().compose_node(parent, index)
        before, mark = self._expanded, self.peek_event().start_mark
        node = super().compose_node(parent, index)
        self._count(1, mark)
        self._sizes[id(node)] = self._expanded - before
        return node

    def _count(self, nodes: int, mark: Any) -> None:
        self._expanded += nodes
        if self._expanded > MAX_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"more than {MAX_NODES} nodes with every alias expanded", mark
            )


_CParser: Any = getattr(getattr(yaml, "_yaml", None), "CParser", None)


class _BoundedLoader(
    _NodeBudget,
    _CParser or yaml.SafeLoader,  # type: ignore[misc]
    yaml.constructor.SafeConstructor,
    yaml.resolver.Resolver,
):
    """The safe loader under `_NodeBudget`; libyaml's scanner and parser where PyYAML has
    them (about 40 times faster than PyYAML's own on a 1 MiB scalar here)."""

    def __init__(self, text: str) -> None:
        if _CParser is None:
            yaml.SafeLoader.__init__(self, text)
        else:
            _CParser.__init__(self, text)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
        _NodeBudget.__init__(self)


def _size_problem(data: bytes) -> str:
    """Why `data` is too big or too deeply nested to parse, or "" (brackets inside quoted
    strings count too: a bound, not a parse)."""
    if len(data) > MAX_BYTES:
        return f"more than {MAX_BYTES} bytes, more than a config file may hold"
    depth = deepest = 0
    for byte in data.translate(None, _NOT_BRACKETS):
        depth = max(depth + (1 if byte in b"[{" else -1), 0)
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        return f"brackets nested {deepest} deep, more than {MAX_DEPTH}"
    return ""


_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))


def load_config(
    model: type[M], uri: str | Path, substitutions: Mapping[str, str] | None = None
) -> M:
    """Read `uri` (see `read_config_file`) and validate it as `model` (see `parse_config`)."""
    return parse_config(model, read_config_file(uri, substitutions), str(uri))


def parse_config(model: type[M], data: Mapping[str, Any], origin: str) -> M:
    """`data` validated as `model`; a ValidationError titled with `origin` in which moved
    and misspelt fields say where they belong."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise explained(error, model, origin) from None


def explained(error: ValidationError, model: type[BaseModel], origin: str) -> ValidationError:
    """`error` again, titled `<model> in <origin>`, each unknown field's message replaced by
    its new place (RENAMED) or the closest known name."""
    details: list[InitErrorDetails] = []
    for problem in error.errors(include_url=False):
        loc = tuple(problem["loc"])
        message = _unknown_field(model, loc) if problem["type"] == "extra_forbidden" else None
        if message is None:
            message = problem["msg"]
        # The message is final: braces in it are not placeholders of a template.
        template = message.replace("{", "{{").replace("}", "}}")
        details.append(
            InitErrorDetails(
                type=PydanticCustomError(problem["type"], template),
                loc=loc,
                input=problem.get("input"),
            )
        )
    return ValidationError.from_exception_data(f"{model.__name__} in {origin}", details)


def _unknown_field(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """What to say of the unknown field at `loc`: where it moved, or the known name it is
    close to; None when nothing better than pydantic's message is known."""
    if not loc:
        return None
    *parents, name = loc
    candidates = _models_at(model, parents)
    dotted = ".".join(str(part) for part in parents)
    prefix = f"{dotted}." if dotted else ""
    for candidate in candidates:
        renamed = getattr(candidate, "RENAMED", {})
        if name in renamed:
            return f"{prefix}{name} has moved: write it as {prefix}{renamed[name]}"
    known = sorted({field for candidate in candidates for field in candidate.model_fields})
    close = difflib.get_close_matches(str(name), known, n=1)
    if close:
        return f"unknown field {prefix}{name}; did you mean {prefix}{close[0]}?"
    return None


def _models_at(model: type[BaseModel], path: Iterable[Any]) -> list[type[BaseModel]]:
    """The models that can sit at `path` (a validation error's location) under `model`:
    fields descend into their models, a union's tag or class name picks its member, and a
    list index or dict key stays with the models of the container's values."""
    candidates = [model]
    for part in path:
        fields = [
            c.model_fields[part]
            for c in candidates
            if isinstance(part, str) and part in c.model_fields
        ]
        if fields:
            candidates = [m for field in fields for m in _models_in(field.annotation)]
            continue
        tagged = [c for c in candidates if part == c.__name__ or part in _tags(c)]
        candidates = tagged or candidates
    return candidates


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds: itself, or those in its Optional, Union,
    Annotated, list or dict arguments."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) is typing.Literal:
        return []
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or args:
        return [model for arg in args for model in _models_in(arg)]
    return []


def _tags(model: type[BaseModel]) -> set[Any]:
    """The values of `model`'s Literal fields: the tags a discriminated union names it by."""
    return {
        value
        for field in model.model_fields.values()
        if typing.get_origin(field.annotation) is typing.Literal
        for value in typing.get_args(field.annotation)
    }
