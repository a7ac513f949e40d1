"""Generate a token-sequence dataset version for the built-in transformer.

    python -m preprocessing.synthetic.tokens --out /tmp/tok --rows 20000 --vocab-size 4096

writes a committed ballast version (shards through `preprocessing.contract.shards`, then
`_MANIFEST.json` and `_CURRENT` through `VersionAttempt.commit`, as every version writer
does, so the loader reads it like any other):
column `tokens` of type fixed_size_list<int32>[seq_len], `label` (class
0..num_classes-1), `id`, and `source`. Each class owns a few "signature" tokens;
a sequence is uniform random tokens with a fraction `signal` of its positions
replaced by its class's signature tokens, so a model must find which
signature dominates; a fraction `label_noise` of rows then get a random label. With
`min_seq_len`, sequences have uneven lengths, padded with id 0.
The loader yields `tokens` as float32 [B, seq_len] (exact for ids below 2^24);
the transformer casts them back to ids.

The version id is a hash of the spec: generating the same spec twice reuses
the committed version.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
from fsspec.core import url_to_fs
from pydantic import BaseModel, ConfigDict, Field

from preprocessing.contract.commit import commit_version
from preprocessing.contract.manifest import (
    Manifest,
    SplitEntry,
    manifest_uri,
    read_manifest,
    shard_name,
)
from preprocessing.contract.shards import write_shard
from preprocessing.versions.attempt import VersionAttempt


class TokenDatasetSpec(BaseModel):
    """What to generate."""

    model_config = ConfigDict(extra="forbid")

    num_rows: int = Field(20_000, gt=0, description="Rows of the train split.")
    holdout_rows: int = Field(2_000, ge=0, description="Rows of the holdout split.")
    seq_len: int = Field(64, gt=0, description="Tokens per sequence.")
    vocab_size: int = Field(4096, gt=1, le=2**24, description="Token ids in [0, vocab_size).")
    num_classes: int = Field(8, gt=1, description="Classes; labels are 0..num_classes-1.")
    signature_tokens: int = Field(8, gt=0, description="Signature tokens owned by each class.")
    signal: float = Field(0.15, gt=0, le=1, description="Fraction of positions from the class.")
    label_noise: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Fraction of rows labelled with a random class instead "
        "(an irreducible loss, as real data has).",
    )
    min_seq_len: int = Field(
        0,
        ge=0,
        description="0: every sequence has seq_len real tokens. Otherwise each "
        "has a length drawn uniformly in [min_seq_len, seq_len], its tail padded with id 0 "
        "and its real tokens drawn from ids >= 1 (uneven samples, for loader.balance_by).",
    )
    rows_per_shard: int = Field(5_000, gt=0, description="Rows per Parquet shard.")
    rows_per_row_group: int = Field(500, gt=0, description="Rows per Parquet row group.")
    seed: int = Field(0, ge=0, description="Seeds the vocabulary split and every sequence.")

    def version_id(self) -> str:
        # Without min_seq_len the spec hashes as before the field existed: same versions.
        unset = {"min_seq_len"} if not self.min_seq_len else None
        digest = hashlib.sha256(self.model_dump_json(exclude=unset).encode()).hexdigest()[:16]
        return f"tokens-{digest}"


def signatures(spec: TokenDatasetSpec) -> np.ndarray:
    """[num_classes, signature_tokens] disjoint token ids owned by each class."""
    needed = spec.num_classes * spec.signature_tokens
    if needed > spec.vocab_size:
        raise ValueError(
            f"vocab_size: {spec.vocab_size} ids cannot give {spec.num_classes} classes "
            f"{spec.signature_tokens} signature tokens each"
        )
    chosen = np.random.default_rng([spec.seed, 0]).permutation(spec.vocab_size)[:needed]
    return chosen.reshape(spec.num_classes, spec.signature_tokens)


def make_rows(spec: TokenDatasetSpec, first_id: int, num_rows: int, stream: int) -> pa.Table:
    """`num_rows` sequences with ids from `first_id`; `stream` keeps splits independent."""
    rng = np.random.default_rng([spec.seed, stream])
    labels = rng.integers(0, spec.num_classes, num_rows)
    tokens = rng.integers(0, spec.vocab_size, (num_rows, spec.seq_len), dtype=np.int32)
    planted = rng.random((num_rows, spec.seq_len)) < spec.signal
    picks = rng.integers(0, spec.signature_tokens, (num_rows, spec.seq_len))
    owned = signatures(spec)[labels[:, None], picks].astype(np.int32)
    tokens = np.where(planted, owned, tokens)
    noisy = rng.random(num_rows) < spec.label_noise
    labels = np.where(noisy, rng.integers(0, spec.num_classes, num_rows), labels)
    if spec.min_seq_len:
        tokens = padded(rng, tokens, spec)
    flat = pa.array(tokens.ravel(), type=pa.int32())
    return pa.table(
        {
            "id": pa.array(np.arange(first_id, first_id + num_rows), type=pa.int64()),
            "label": pa.array(labels, type=pa.int64()),
            "source": pa.array(["synthetic"] * num_rows),
            "tokens": pa.FixedSizeListArray.from_arrays(flat, spec.seq_len),
        }
    )


def padded(rng: np.random.Generator, tokens: np.ndarray, spec: TokenDatasetSpec) -> np.ndarray:
    """`tokens` with real ids >= 1 and each row cut to a length in [min_seq_len, seq_len],
    its tail set to the pad id 0."""
    if spec.min_seq_len > spec.seq_len:
        raise ValueError(f"min_seq_len: {spec.min_seq_len} exceeds seq_len {spec.seq_len}")
    lengths = rng.integers(spec.min_seq_len, spec.seq_len + 1, len(tokens))
    real = np.where(tokens == 0, 1, tokens)
    return np.where(np.arange(spec.seq_len) < lengths[:, None], real, 0).astype(np.int32)


def write_split(
    spec: TokenDatasetSpec, shard_uri: Callable[[str], str], split: str, table: pa.Table
) -> SplitEntry:
    """Write `table` as shards of `rows_per_shard` (shard `name` at `shard_uri(name)`);
    the split's manifest entry."""
    entries = [
        write_shard(
            shard_uri(shard_name(split, index)),
            table.slice(offset, spec.rows_per_shard),
            spec.rows_per_row_group,
            "label",
            "source",
        )
        for index, offset in enumerate(range(0, table.num_rows, spec.rows_per_shard))
    ]
    return SplitEntry(num_rows=table.num_rows, shards=entries)


def write_token_dataset(root: str, spec: TokenDatasetSpec) -> str:
    """Write (or find) the version of `spec` under `root` and make it current; returns root."""
    location = manifest_uri(root, spec.version_id())
    fs, path = url_to_fs(location)
    if fs.exists(path):
        commit_version(root, read_manifest(location)[0])  # committed: made current again
        return root
    with VersionAttempt(root, spec.version_id()) as attempt:
        attempt.commit(write_shards(attempt.shard_uri, spec))
    return root


def write_shards(shard_uri: Callable[[str], str], spec: TokenDatasetSpec) -> Manifest:
    """Write the shards of `spec`'s version (shard `name` at `shard_uri(name)`); their
    manifest."""
    train = make_rows(spec, 0, spec.num_rows, stream=1)
    splits = {"train": write_split(spec, shard_uri, "train", train)}
    if spec.holdout_rows:
        holdout = make_rows(spec, spec.num_rows, spec.holdout_rows, stream=2)
        splits["holdout"] = write_split(spec, shard_uri, "holdout", holdout)
    return manifest_of(spec, train.schema, splits)


def manifest_of(
    spec: TokenDatasetSpec, schema: pa.Schema, splits: dict[str, SplitEntry]
) -> Manifest:
    """The manifest of a generated version: one feature column, `tokens`."""
    counts: Counter[str] = Counter()
    for entry in splits["train"].shards:
        counts.update(entry.class_counts)
    return Manifest(
        version_id=spec.version_id(),
        label_column="label",
        source_column="source",
        id_column="id",
        feature_columns=["tokens"],
        classes=list(range(spec.num_classes)),
        sources=["synthetic"],
        arrow_schema=[{"name": f.name, "type": str(f.type)} for f in schema],
        splits=splits,
        seed=spec.seed,
        config=json.loads(spec.model_dump_json()),
        input_fingerprint=f"generated:{spec.version_id()}",
        input_class_counts=dict(counts),
        input_source_counts={"synthetic": splits["train"].num_rows},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m preprocessing.synthetic.tokens",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, help="Output root (local path or URI).")
    for name, field in TokenDatasetSpec.model_fields.items():
        flag = "--" + name.replace("_", "-").replace("num-rows", "rows")
        parser.add_argument(
            flag, dest=name, type=type(field.default), default=field.default, help=field.description
        )
    args = vars(parser.parse_args(argv))
    root = args.pop("out")
    write_token_dataset(
        str(Path(root).absolute()) if "://" not in root else root, TokenDatasetSpec(**args)
    )
    print(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
