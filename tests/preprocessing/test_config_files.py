"""Every config is read through one loader (preprocessing/toolbox/config_files.py): a
local path or any fsspec URI, errors naming the file; a moved field is refused naming its
new place, a misspelt one gets the closest known name."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

import fsspec
import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from preprocessing.config import ReshardConfig
from preprocessing.toolbox.config_files import ConfigFileError, load_config, parse_config
from training.config import TrainConfig

GOOD = """\
dataset:
  inputs: [/data/raw]
output_root: /data/out
mode: incremental
incremental:
  max_chain_length: 4
"""


def test_a_good_config_loads_from_a_path(tmp_path: Path) -> None:
    """Invariant: a valid file loads into its model, the incremental section included."""
    path = tmp_path / "reshard.yaml"
    path.write_text(GOOD)
    config = load_config(ReshardConfig, path)
    assert config.incremental.max_chain_length == 4
    assert config.incremental.on_changed_inputs == "refuse"


@pytest.mark.parametrize(
    "old", ["on_changed_inputs: rebuild", "max_chain_length: 3", "max_small_shard_fraction: 0.5"]
)
def test_an_old_field_name_is_refused_naming_its_new_place(old: str, tmp_path: Path) -> None:
    """Invariant: a field that moved under `incremental:` is refused (still a pydantic
    ValidationError) with the file and the field's new dotted place."""
    path = tmp_path / "old.yaml"
    path.write_text(GOOD.replace("incremental:\n  max_chain_length: 4\n", old + "\n"))
    name = old.split(":")[0]
    with pytest.raises(ValidationError) as raised:
        load_config(ReshardConfig, path)
    text = str(raised.value)
    assert str(path) in text
    assert f"{name} has moved: write it as incremental.{name}" in text


def test_a_moved_field_is_named_where_the_config_is_nested() -> None:
    """Invariant: a model's RENAMED table is consulted wherever the model sits (here a
    ReshardConfig under `reshard:`), and the message gives the full dotted path."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        reshard: ReshardConfig

    data = {"reshard": {"dataset": {"inputs": ["x"]}, "output_root": "o", "max_chain_length": 2}}
    with pytest.raises(
        ValidationError,
        match=r"reshard\.max_chain_length has moved: write "
        r"it as reshard\.incremental\.max_chain_length",
    ):
        parse_config(Params, data, "params.yaml")


class Slurm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    RENAMED: ClassVar[dict[str, str]] = {"gpus": "resources.gpus_per_node"}
    kind: Literal["slurm"]
    partition: str = "gpu"


class Local(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["local"]
    num_processes: int = 1


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job: Annotated[Slurm | Local, Field(discriminator="kind")]


def test_another_module_extends_the_renames_on_its_own_model() -> None:
    """Invariant: a member of a discriminated union declares its own RENAMED table and the
    loader finds it through the tag; a typo in the other member gets "did you mean"."""
    with pytest.raises(
        ValidationError,
        match=r"job\.slurm\.gpus has moved: write it as "
        r"job\.slurm\.resources\.gpus_per_node",
    ):
        parse_config(Job, {"job": {"kind": "slurm", "gpus": 4}}, "job.yaml")
    with pytest.raises(ValidationError, match=r"did you mean job\.local\.num_processes\?"):
        parse_config(Job, {"job": {"kind": "local", "num_process": 4}}, "job.yaml")


def test_a_typo_says_did_you_mean_and_other_errors_stay(tmp_path: Path) -> None:
    """Invariants: an unknown field close to a known one names it, nested or not; other
    problems of the same file keep pydantic's message; the train config goes through the
    same loader."""
    path = tmp_path / "typo.yaml"
    path.write_text(
        "dataset:\n  inputs: [x]\n  lable_column: y\noutput_root: o\n"
        "seeed: 1\nholdout_fraction: 2\n"
    )
    with pytest.raises(ValidationError) as raised:
        load_config(ReshardConfig, path)
    text = str(raised.value)
    assert "unknown field dataset.lable_column; did you mean dataset.label_column?" in text
    assert "unknown field seeed; did you mean seed?" in text
    assert "holdout_fraction" in text and "less than 1" in text
    train = tmp_path / "train.yaml"
    train.write_text("dataset: x\noutput_dir: o\nmax_epoch: 2\n")
    with pytest.raises(ValidationError, match="did you mean max_epochs"):
        load_config(TrainConfig, train)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    """Invariant: a missing file, broken YAML and a file that is no mapping each fail
    naming the file."""
    with pytest.raises(FileNotFoundError, match=r"nope\.yaml"):
        load_config(ReshardConfig, tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("dataset: [unclosed\n")
    with pytest.raises(ConfigFileError, match=r"broken\.yaml: not valid YAML"):
        load_config(ReshardConfig, broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(ConfigFileError, match=r"list\.yaml: holds a list, not a mapping"):
        load_config(ReshardConfig, listed)


@pytest.mark.slow
def test_a_config_loads_from_s3(s3_endpoint: str) -> None:
    """Invariant: an s3:// config (moto's server) loads like a local file, and its errors
    name the URI."""
    fs = fsspec.filesystem("s3")
    fs.mkdir("configs")
    fs.pipe_file("configs/reshard.yaml", GOOD.encode())
    fs.pipe_file("configs/old.yaml", GOOD.replace("incremental:\n  ", "").encode())
    config = load_config(ReshardConfig, "s3://configs/reshard.yaml")
    assert config.mode == "incremental" and config.incremental.max_chain_length == 4
    with pytest.raises(
        ValidationError,
        match=r"(?s)s3://configs/old\.yaml.*max_chain_length "
        r"has moved",
    ):
        load_config(ReshardConfig, "s3://configs/old.yaml")
