"""Each run owns its mutable state (training/config.py `TrainConfig.of_run`,
training/launch/job.py): a job's output_dir and checkpoint_dir become folders of its run
(`<dir>/runs/<run_key>`), so two runs on one work dir share no pinned config, checkpoint,
summary or plot; a retry resumes only its own checkpoint, and a new run resumes another's
only when the config names it (`resume_from_run`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from training.config import TrainConfig
from training.data.split_memory import FILE_NAME, split_path
from training.launch.job import PinnedJob, checkpoint_to_resume, new_run_key

KEYS = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,40}", fullmatch=True)


def config(tmp: str, **fields: object) -> TrainConfig:
    return TrainConfig(dataset="s3://data/root", output_dir=f"{tmp}/work/training", **fields)


@given(KEYS, KEYS, st.booleans())
def test_two_runs_share_no_folder(first: str, second: str, explicit: bool) -> None:
    """Invariant: for any two distinct run keys (with or without an explicit checkpoint_dir),
    neither run's output or checkpoint folder contains the other's; pinning a pinned
    config again changes nothing."""
    base = config("/w", checkpoint_dir="s3://ckpt/team" if explicit else None)
    a, b = base.of_run(first), base.of_run(second)
    assert a.of_run(second) == a
    folders_a = {a.output_dir, a.checkpoint_uri}
    folders_b = {b.output_dir, b.checkpoint_uri}
    if first == second:
        assert folders_a == folders_b
        return
    for mine in folders_a:
        for theirs in folders_b:
            assert not f"{mine}/".startswith(f"{theirs}/")
            assert not f"{theirs}/".startswith(f"{mine}/")


@given(KEYS, KEYS, st.sampled_from(["/w/work/training", "/w/work/training/", "s3://b/out"]))
def test_runs_of_one_output_dir_share_one_balance_split_file(
    first: str, second: str, output_dir: str
) -> None:
    """Invariant: every run of an output dir (any two run keys, or none yet) resolves to the
    same `balance_split.json`, at the top of that output dir, inside no run's folder."""
    base = TrainConfig(dataset="s3://data/root", output_dir=output_dir)
    a, b = base.of_run(first), base.of_run(second)
    shared = f"{output_dir.rstrip('/')}/{FILE_NAME}"
    assert {split_path(run.shared_output_dir) for run in (base, a, b)} == {shared}
    assert not any(shared.startswith(f"{run.output_dir}/") for run in (a, b))


@given(st.text(min_size=0, max_size=20).filter(lambda key: not key.isalnum() or not key))
def test_a_run_key_that_is_no_folder_name_is_refused(key: str) -> None:
    """Invariant: a key that could climb out of `runs/` or name no folder (`..`, a slash,
    an empty or hostile string) is refused naming the field, never used as a path."""
    try:
        scoped = config("/w").of_run(key)
    except ValueError as error:
        assert "run_key" in str(error)
        return
    assert "/" not in key and key not in ("", ".", "..") and not key.startswith(".")
    assert scoped.output_dir == f"/w/work/training/runs/{key}"


def test_a_retry_resumes_only_its_own_checkpoint_a_named_run_only_when_asked() -> None:
    """Invariants: a retry alone (config not resuming) looks at the run's own last.ckpt
    only; `resume: true` then looks at the named run's, then at a last.ckpt left directly
    in checkpoint_dir by a release before run folders; a bad name is refused."""
    own = config("/w").of_run("tonight")
    assert own.resume_candidates == ["/w/work/training/runs/tonight/checkpoints/last.ckpt"]
    assert own.model_copy(update={"resume": True}).resume_candidates == [
        "/w/work/training/runs/tonight/checkpoints/last.ckpt",
        "/w/work/training/checkpoints/last.ckpt",
    ]
    named = config("/w", checkpoint_dir="/c", resume=True, resume_from_run="last-night")
    assert named.of_run("tonight").resume_candidates == [
        "/c/runs/tonight/last.ckpt",
        "/c/runs/last-night/last.ckpt",
        "/c/last.ckpt",
    ]
    with pytest.raises(ValueError, match="resume_from_run"):
        config("/w", resume_from_run="../other")


def test_the_launcher_resumes_the_named_run_and_prefers_its_own(tmp_path: Path) -> None:
    """Invariant: with `resume_from_run`, the first attempt starts from that run's
    checkpoint; once the run saved its own, every later attempt resumes its own."""
    cfg = config(str(tmp_path), resume=True, resume_from_run="earlier").of_run(new_run_key())
    earlier = tmp_path / "work/training/runs/earlier/checkpoints/last.ckpt"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"earlier")
    pinned = PinnedJob(cfg, f"{cfg.output_dir}/train-config.pinned.yaml", {})
    assert checkpoint_to_resume(pinned, resume=True, attempt=1) == str(earlier)
    Path(cfg.checkpoint_uri).mkdir(parents=True)
    Path(cfg.last_checkpoint_uri).write_bytes(b"own")
    assert checkpoint_to_resume(pinned, resume=True, attempt=2) == cfg.last_checkpoint_uri


def test_new_run_keys_do_not_repeat() -> None:
    """Invariant: generated keys are folder names and distinct."""
    keys = {new_run_key() for _ in range(200)}
    assert len(keys) == 200
    assert all(config("/w").of_run(key).run_key == key for key in keys)


def test_a_summary_of_another_config_is_refused(tmp_path: Path) -> None:
    """Invariant: the job's result names the run's own folders and the pinned file's
    sha256; a summary whose ranks ran another file (another sha256, or none) is refused
    naming both hashes, never returned as this run's."""
    from training.launch import TrainingFailed
    from training.launch.job import ran

    cfg = config(str(tmp_path)).of_run("tonight")
    pinned = PinnedJob(cfg, f"{cfg.output_dir}/train-config.pinned.yaml", {}, "a" * 64)
    result = ran(pinned, {"config_sha256": "a" * 64})
    assert result["run_key"] == "tonight" and result["output_dir"] == cfg.output_dir
    assert result["checkpoint_uri"] == f"{cfg.output_dir}/checkpoints"
    for other in ("b" * 64, None):
        with pytest.raises(TrainingFailed, match="not the pinned one"):
            ran(pinned, {"config_sha256": other})


def test_the_nodes_of_a_multinode_job_derive_one_run_key() -> None:
    """Invariant: every node of a multinode job pins the same run folder (each pins on its
    own): its MLflow run's id, or a digest of the job's name, rendezvous and version; a
    local job gets none (a new key per job)."""
    from tracking.config import TrackingConfig
    from training.launch import LocalJob, MultiNodeJob
    from training.launch.job import nodes_key

    def node() -> MultiNodeJob:
        return MultiNodeJob(
            kind="multinode", num_nodes=2, job_name="nightly", rdzv_endpoint="10.0.0.1:29500"
        )

    cfg = config("/w")
    assert nodes_key(cfg, node()) == nodes_key(cfg, node()) is not None
    assert nodes_key(cfg.model_copy(update={"dataset": "s3://other"}), node()) != nodes_key(
        cfg, node()
    )
    tracked = cfg.model_copy(
        update={"tracking": TrackingConfig(tracking_uri="http://mlflow", run_id="abc123")}
    )
    assert nodes_key(tracked, node()) == "abc123"
    assert nodes_key(cfg, LocalJob()) is None
