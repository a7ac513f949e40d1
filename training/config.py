"""Typed configuration of a training job, loaded from YAML by `python -m training`.

One pydantic model per concern, every field described, unknown fields refused:
`LoaderConfig` (streaming), `ModelConfig` (which LightningModule, and the sizes
of the built-in ones), `CommConfig` (DDP gradient communication) and
`TrainConfig` (the job: strategy, precision, checkpoints, resume). Validation
errors name the field, e.g. `model.class_path` or `comm.powersgd_rank`.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path
from typing import Literal

import yaml
from fsspec.core import url_to_fs
from pydantic import BaseModel, ConfigDict, Field, model_validator

from preprocessing.toolbox.config_files import load_config
from tracking.config import TrackingConfig
from training.data.readahead import ReadConfig
from training.models.config import (
    ModelConfig,
)

LAST_CHECKPOINT_NAME = "last.ckpt"  # the one name of the checkpoint a run resumes from
RUNS_FOLDER = "runs"  # <output_dir>/runs/<run_key>: one run's own files
RUN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class LoaderConfig(BaseModel):
    """How a split of a dataset version is streamed to every rank."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(64, gt=0, description="Samples per batch on each rank.")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes per rank.")
    remainder: Literal["drop", "pad"] = Field(
        "drop",
        description="Samples left over after the last full global batch: `drop` them, or `pad` "
        "the last global batch with repeats that carry weight 0 (used for validation).",
    )
    num_partitions: int = Field(
        16,
        gt=0,
        description="Parts the epoch's stream is cut into (training/data/partition.py); "
        "world size x max(num_workers, 1) must divide it, and each rank's workers then "
        "decode only their partitions' rows. It orders the epoch: a run resumes only with "
        "the value it was saved with, on any world size and worker count dividing it. "
        "Memory: each worker holds one shuffle window per partition it serves.",
    )
    shuffle_window_row_groups: int = Field(
        4,
        gt=0,
        description="Rows shuffled together inside a partition, in row groups: a batch "
        "takes its rows from about this many row groups of different shards. Part of the "
        "epoch's order, like num_partitions; read-ahead covers one window.",
    )
    balance: Literal["equal", "speed", "fixed"] = Field(
        "equal",
        description="How each global step's rows are shared among ranks "
        "(training/data/balance.py): `equal` (batch_size each), `fixed`: the shares of "
        "`balance_shares`, held the whole run (a split chosen by hand, or a benchmark's "
        "oracle), or `speed`: the same rows "
        "per step, split so that the ranks' predicted steps of their own work (data wait "
        "and compute, each rank's a fixed cost plus a cost per row fitted from intervals at "
        "two splits; until then shares follow samples per second) are equal, or the equal "
        "split when moving rows would gain under 3 % (read every `balance_every_n_steps`, "
        "within 1/4 and 4x the equal share, the equal split exactly while the ranks are "
        "within 10 % of alike; the split moves only when two consecutive intervals agree, "
        "training/data/speed_control.py; learned once: kept across epochs and in the "
        "checkpoint for a resume on the same world size and hosts, and in the output "
        "dir's `balance_split.json` for the next job on them), "
        "the loss weighted by each rank's rows so the gradient is the same global "
        "mean. Each rank then reads the units its slice of a step overlaps (about its share "
        "plus up to two units of the step, training/data/balance.py); needs "
        "num_workers 0 and strategy ddp or auto. Not part of the epoch's order: a run may "
        "resume with either value.",
    )
    balance_by: Literal["samples", "tokens"] = Field(
        "samples",
        description="What a rank's share counts: `samples` (rows), or `tokens`: real tokens "
        "of sequence data (non-zero token ids; 0 is the pad id), each step's rows cut so "
        "every rank's token sum follows its share. `tokens` slices whole steps as `speed` "
        "does, with the same needs.",
    )
    balance_shares: list[float] | None = Field(
        None,
        description="`balance: fixed`: each rank's fraction of every global step's rows, "
        "one per rank (the job's world size), each > 0, summing to 1 (within 1e-6); rows "
        "are cut by largest remainder. Only with `balance: fixed`.",
    )
    balance_every_n_steps: int = Field(
        10,
        gt=0,
        description="`balance: speed`: the fewest optimizer steps a re-plan reads (each one "
        "rides on the per-interval all_gather of the step times, no collective of its own; "
        "shorter intervals, as at an epoch's end, are summed with the next); an interval "
        "also lasts at least 0.25 s at the last one's pace, so that a rank under a CPU "
        "quota is read over its bursts and stalls alike. A change of speed moves the split "
        "two intervals after it shows.",
    )

    @model_validator(mode="after")
    def shares_with_fixed(self) -> LoaderConfig:
        shares = self.balance_shares
        if (self.balance == "fixed") != (shares is not None):
            raise ValueError(
                "loader.balance_shares goes with loader.balance: fixed and only with it "
                f"(balance is {self.balance}, balance_shares {shares})"
            )
        # Written so that NaN fails each comparison, hence the check.
        if shares is not None and not (
            shares and all(share > 0 for share in shares) and abs(sum(shares) - 1.0) <= 1e-6
        ):
            raise ValueError(
                f"loader.balance_shares {shares} must be fractions > 0, one per rank, "
                f"summing to 1 (they sum to {sum(shares)})"
            )
        return self

    @model_validator(mode="after")
    def balanced_in_process(self) -> LoaderConfig:
        if self.balanced and self.num_workers:
            raise ValueError(
                f"loader.balance: {self.balance} / loader.balance_by: {self.balance_by} slice "
                "each global step in the rank's own process when it is handed out; set "
                f"loader.num_workers to 0 (it is {self.num_workers}) or use balance: equal"
            )
        return self

    @property
    def balanced(self) -> bool:
        """Whether ranks take slices of whole global steps (training/data/balance.py)."""
        return self.balance != "equal" or self.balance_by != "samples"

    @property
    def sliced_by_units(self) -> bool:
        """Whether a rank reads only the units its slice overlaps (`speed` by samples): a
        token split needs every row's token count, so `tokens` reads whole steps."""
        return self.balance in ("speed", "fixed") and self.balance_by == "samples"


class CommConfig(BaseModel):
    """How DDP communicates gradients; every option is measured (training/distributed/comm.py)."""

    model_config = ConfigDict(extra="forbid")

    hook: Literal["none", "fp16", "bf16", "powersgd", "post_local_sgd"] = Field(
        "none",
        description="`none`: plain all-reduce; `fp16`/`bf16`: all-reduce a half-width copy; "
        "`powersgd`: low-rank factors; `post_local_sgd`: no gradient all-reduce after the "
        "warm-up, parameters averaged every `local_sgd_period` steps.",
    )
    powersgd_rank: int = Field(1, gt=0, description="PowerSGD: rank of the approximation.")
    warmup_steps: int = Field(
        10, ge=2, description="PowerSGD / post-local SGD: plain all-reduce steps first."
    )
    local_sgd_period: int = Field(
        4, gt=0, description="Post-local SGD: optimizer steps between parameter averagings."
    )
    bucket_cap_mb: float = Field(25.0, gt=0, description="DDP gradient bucket size (MiB).")


class SelectBestConfig(BaseModel):
    """Keep the best epoch's weights, not the last, and stop once it stops improving
    (training/selection.py): judged on the version's validation split."""

    model_config = ConfigDict(extra="forbid")

    monitor: Literal["val_loss", "val_macro_f1"] = Field(
        "val_loss",
        description="The validation figure that chooses: `val_loss` (lowest wins) or "
        "`val_macro_f1` (highest wins); a tie keeps the earlier epoch.",
    )
    patience: int = Field(
        3, gt=0, description="Stop after this many epochs in a row without a better figure."
    )
    on_holdout: bool = Field(
        False,
        description="Also select on the holdout of a version without a validation split "
        "(then promotion judges the rows that chose the model; a warning says so). "
        "False: such a version is refused, naming dataset.validation_fraction.",
    )


class TrainConfig(BaseModel):
    """One training job on one dataset version."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(
        description="Manifest URI, version directory or output root (read through `_CURRENT`)."
    )
    output_dir: str = Field(
        description="Each run's `summary.json`, pinned config, plots (and by default "
        "checkpoints) go to its own folder `runs/<run_key>/` here."
    )
    checkpoint_dir: str | None = Field(
        None,
        description="Any fsspec URI (s3:// included), each run's in its `runs/<run_key>/`; "
        "default `<output_dir>/runs/<run_key>/checkpoints`.",
    )
    checkpoint_every_n_steps: int | None = Field(
        None, gt=0, description="Also checkpoint every this many optimizer steps (mid-epoch)."
    )
    resume: bool = Field(
        False,
        description="Continue from the run's own `last.ckpt` when there is one, else from "
        "`resume_from_run`'s, else from a `last.ckpt` left directly in checkpoint_dir by a "
        "release before runs had folders of their own.",
    )
    resume_from_run: str | None = Field(
        None,
        description="A new run starts from this run's `last.ckpt` (its folder name under "
        "`<checkpoint_dir>/runs/`, the Prefect flow run id of a pipeline): the only way a run "
        "resumes another's checkpoint. Needs `resume: true`.",
    )
    run_key: str | None = Field(
        None,
        description="The run whose folder output_dir and checkpoint_dir are "
        "(`.../runs/<run_key>`): set when the launcher pins the job, never by hand.",
    )
    seed: int = Field(0, description="Seeds weights and the sample order of every epoch.")
    max_epochs: int = Field(3, gt=0, description="Passes over the training split.")
    strategy: Literal["auto", "ddp", "fsdp", "tp"] = Field(
        "auto",
        description="`auto`: DDP over several ranks, one device alone; `ddp` (even on one "
        "rank); `fsdp` (FSDP2, fully_shard per block); `tp` (tensor parallel over "
        "`tensor_parallel_size` ranks, FSDP2 over the rest: the transformer only).",
    )
    tensor_parallel_size: int = Field(
        2, gt=0, description="`tp`: ranks per tensor-parallel group (divides the world size)."
    )
    precision: Literal["32-true", "bf16-mixed", "bf16-true", "16-mixed"] = Field(
        "32-true", description="Lightning precision; `16-mixed` needs CUDA and ddp/auto."
    )
    accumulate_grad_batches: int = Field(1, gt=0, description="Batches per optimizer step.")
    gradient_clip_norm: float | None = Field(
        None, gt=0, description="Clip the global gradient norm to this; None: no clipping."
    )
    process_group_timeout_s: int = Field(
        120, gt=0, description="A peer silent this long fails the job instead of hanging it."
    )
    hang_timeout_s: float | None = Field(
        None,
        gt=0,
        description="A rank of a job of several that finishes no train step for "
        "this long fails the attempt, naming the stuck ranks, and the launcher retries it "
        "(training/distributed/watchdog.py); it must exceed the longest step and checkpoint "
        "write. None: 90 % of process_group_timeout_s, so that it fires before the "
        "collective's own timeout, which cannot say which rank is stuck.",
    )
    comm: CommConfig = Field(default_factory=CommConfig, description="DDP gradient comm.")
    loader: LoaderConfig = Field(default_factory=LoaderConfig, description="Streaming.")
    read: ReadConfig = Field(default_factory=ReadConfig, description="Read-ahead and cache.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The model.")
    select_best: SelectBestConfig | None = Field(
        None,
        description="Early stopping and the best epoch's weights as the model logged "
        "(ddp or auto); None: every epoch runs and the last weights are logged.",
    )
    tracking: TrackingConfig | None = Field(None, description="MLflow target; None logs nothing.")

    @model_validator(mode="after")
    def consistent_strategy(self) -> TrainConfig:
        if self.precision == "16-mixed" and self.strategy in ("fsdp", "tp"):
            raise ValueError(
                f"precision: 16-mixed is not supported with strategy {self.strategy}; "
                "use bf16-mixed"
            )
        if self.loader.balanced and self.strategy not in ("ddp", "auto"):
            raise ValueError(
                f"loader.balance: {self.loader.balance} / loader.balance_by: "
                f"{self.loader.balance_by} apply to ddp, not {self.strategy}"
            )
        if self.comm.hook != "none" and self.strategy not in ("ddp", "auto"):
            raise ValueError(f"comm.hook: {self.comm.hook} applies to ddp, not {self.strategy}")
        if self.select_best is not None and self.strategy not in ("ddp", "auto"):
            # Its copy of the best weights is a plain state dict; sharded DTensors are not.
            raise ValueError(f"select_best applies to ddp or auto, not strategy {self.strategy}")
        return self

    @property
    def watchdog_timeout_s(self) -> float:
        """Seconds without a train step before a rank's watchdog fails the attempt."""
        return self.hang_timeout_s or 0.9 * self.process_group_timeout_s

    @property
    def checkpoint_uri(self) -> str:
        return (self.checkpoint_dir or f"{self.output_dir.rstrip('/')}/checkpoints").rstrip("/")

    @property
    def shared_output_dir(self) -> str:
        """The output dir all runs of it share (above `runs/<run_key>` once pinned): the
        home of what is kept for every run, not one run's state (`balance_split.json`)."""
        if self.run_key is None:
            return self.output_dir
        return self.output_dir.removesuffix(f"/{RUNS_FOLDER}/{self.run_key}")

    @property
    def last_checkpoint_uri(self) -> str:
        """Where every attempt saves, and a resuming one looks first."""
        return f"{self.checkpoint_uri}/{LAST_CHECKPOINT_NAME}"

    def of_run(self, run_key: str) -> TrainConfig:
        """This config with output_dir and checkpoint_dir the folders of run `run_key`
        (`<dir>/runs/<run_key>`): what one run writes, no other run does. A config pinned
        to a run already stays as it is (a multinode job's nodes each pin the same file)."""
        if self.run_key is not None:
            return self
        if not RUN_KEY.fullmatch(run_key):
            raise ValueError(f"run_key: {run_key!r} is not a folder name ([A-Za-z0-9_.-]+)")
        scoped = {"run_key": run_key, "output_dir": _run_folder(self.output_dir, run_key)}
        if self.checkpoint_dir is not None:
            scoped["checkpoint_dir"] = _run_folder(self.checkpoint_dir, run_key)
        return self.model_copy(update=scoped)

    @property
    def resume_candidates(self) -> list[str]:
        """The checkpoints a resuming run starts from, the first that exists: its own; and
        when the config asks to resume (not a retry alone), then the run it names
        (`resume_from_run`), then a `last.ckpt` of a release before run folders."""
        own = self.last_checkpoint_uri
        if self.run_key is None or not self.resume:
            return [own]
        # <root>/runs/<key><rest>: `<rest>` is `/checkpoints` under the default checkpoint_dir
        root, _, rest = own.rpartition(f"/{RUNS_FOLDER}/{self.run_key}/")
        named = self.resume_from_run
        others = [f"{root}/{RUNS_FOLDER}/{named}/{rest}"] if named else []
        return [own, *others, f"{root}/{rest}"]

    @model_validator(mode="after")
    def named_resume(self) -> TrainConfig:
        if self.resume_from_run is not None and not RUN_KEY.fullmatch(self.resume_from_run):
            raise ValueError(
                f"resume_from_run: {self.resume_from_run!r} is not a run's folder name"
            )
        return self


def _run_folder(directory: str, run_key: str) -> str:
    return f"{directory.rstrip('/')}/{RUNS_FOLDER}/{run_key}"


def config_sha256(uri: str) -> str:
    """The sha256 of the config file at `uri` as stored: what a run says it ran."""
    fs, path = url_to_fs(uri)
    return hashlib.sha256(fs.cat_file(path)).hexdigest()


def load_train_config(path: str | Path) -> TrainConfig:
    """Read a YAML training config from a path or any fsspec URI; errors name the file and
    the bad field (an old field name: its new place)."""
    return load_config(TrainConfig, path)


def dump_train_config(cfg: TrainConfig, path: str | Path) -> str:
    """Write `cfg` as YAML (any fsspec URI); returns the location written."""
    fs, location = url_to_fs(str(path))
    fs.makedirs(location.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(location, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False).encode())
    return str(path)


def check_selection_split(config: SelectBestConfig | None, chosen_on: str | None) -> None:
    """Refuse selection on a version without a validation split, unless it may select on
    the holdout (`on_holdout`), which it then says loudly."""
    if config is None or chosen_on == "validation":
        return
    if chosen_on == "holdout" and config.on_holdout:
        warnings.warn(
            "select_best: this version has no validation split, so the holdout chooses the "
            "epoch and then judges the model it chose (set dataset.validation_fraction)",
            stacklevel=2,
        )
        return
    where = "no validation split" if chosen_on == "holdout" else "neither validation nor holdout"
    raise ValueError(
        f"select_best: the dataset version has {where} to select on; set "
        "dataset.validation_fraction when resharding (or select_best.on_holdout: true to "
        "let the holdout choose the model it then judges)"
    )
