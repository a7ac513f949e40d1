"""The manifest's JSON (preprocessing/contract/documents.py): the same document as the
standard library writes from `dataclasses.asdict`, one shard per line, read back equal."""

from __future__ import annotations

import json
from dataclasses import asdict

from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.contract.documents import document_json
from preprocessing.contract.manifest import Manifest, ShardEntry, SplitEntry
from tests.test_fuzz_readers import sample_manifest

NAMES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | NAMES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=12,
)


def test_a_manifest_reads_back_equal_with_each_shard_on_one_line() -> None:
    """Invariants: the JSON is the document `json.dumps(asdict(manifest))` writes, the
    manifest read back from it is the one written, and each shard entry is one line."""
    manifest = sample_manifest()
    text = document_json(manifest)
    assert json.loads(text) == json.loads(json.dumps(asdict(manifest), default=str))
    assert Manifest.from_json(text, "test") == manifest
    for shard in manifest.splits["train"].shards:
        line = next(line for line in text.splitlines() if f'"{shard.path}"' in line)
        assert json.loads(line.strip().rstrip(",")) == asdict(shard)


@given(config=st.dictionaries(NAMES, VALUES, max_size=6), classes=st.lists(NAMES, max_size=4))
@settings(max_examples=200, deadline=None)
def test_any_config_and_class_names_give_the_standard_librarys_document(config, classes) -> None:
    """Invariant: whatever a user's config and class names hold (odd keys, nesting, lists
    of mappings), the laid-out JSON parses to what `json.dumps(asdict(...))` writes."""
    entry = ShardEntry("shard-00000.parquet", 1, 10, 1, 1, "0" * 64, {"a": 1}, {"s": 1})
    manifest = Manifest(
        version_id="v1",
        label_column="label",
        source_column="source",
        id_column="id",
        feature_columns=[],
        classes=classes,
        sources=["s"],
        arrow_schema=[],
        splits={"train": SplitEntry(1, [entry])},
        seed=0,
        config=config,
        input_fingerprint="f",
        input_class_counts={},
        input_source_counts={},
    )
    text = document_json(manifest)
    assert json.loads(text) == json.loads(json.dumps(asdict(manifest), default=str))
