"""Session-wide fixtures: a real Dask LocalCluster of worker processes (started by the
executor, as a run starts it), tiny skewed data, the services, and runs that several tests
read (one `ballast run pipeline` command: tests/cli_pipeline.py); the checks of the two tiers
(tests/tiers.py: the quick tier starts no process or service; tests over 60 s are end to end
or reported). A test that only reads a run asks for its fixture instead of running its own."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs
from distributed import Client

from preprocessing.driver.cluster import local_cluster
from preprocessing.synthetic.tabular import SampleSpec, write_sample
from tests.cli_pipeline import CliRun, run_cli_pipeline
from tests.fault_proxy import FaultyS3Proxy
from tests.parallel import mark_group, order_items, suffix_groups
from tests.tiers import TierChecks

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# One OpenMP thread for torch in this process and in every process it starts (torchrun sets
# it for ranks of a job of 2 or more; a one-rank job, an in-process run_training and a
# benchmark were left at one per core): on this 2-core host, loaded by the suite's own
# workers, OpenMP's threads spin against the other processes, and the fit loop of a 42-step
# training took 2.1-4.1 s with two threads against 0.4-0.6 s with one (load 4-6). Read by
# torch when it is first imported, which no plugin does before this file.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Under pytest-xdist (`make test`) each worker gets a Prefect home of its own: a `ballast run`
# that starts a temporary server keeps its database there, and two servers writing one
# sqlite file at once fail with "database is locked".
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["PREFECT_HOME"] = str(
        Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect"))
        / f"xdist-{os.environ['PYTEST_XDIST_WORKER']}"
    )

# The end-to-end tests allowed over 60 s (setup + call + teardown), as node ids without
# parameters. Any other test over 60 s is reported at the end of the run and fails it
# under BALLAST_ENFORCE_DURATIONS=1 (.ci/run): make it cheaper or, if end to end, list it.
# A session fixture's setup counts toward the first test that asks for it: the pipeline run
# (tests/flows/conftest.py) is paid by the first operator-view test of a full run, the
# `ballast run pipeline` command (cli_pipeline_run) by the console test.
NIGHTLY_VARIABLE = "BALLAST_NIGHTLY"  # =1: collect the `nightly` tier (make nightly)
END_TO_END: frozenset[str] = frozenset(
    {
        # two `ballast run pipeline` at once on one Prefect and one MLflow server
        "tests/flows/test_concurrent_nights.py::"
        "test_two_nights_at_once_each_record_their_own_lineage",
        "tests/nightly/test_five_nights.py::test_five_nights_at_once_keep_the_registry_true",
        # the stall watch's shipped defaults: 60 s+ tasks on a slowed worker, a frozen one
        "tests/nightly/test_stall_defaults.py::"
        "test_tasks_of_over_a_minute_on_a_slowed_worker_remove_nothing",
        "tests/nightly/test_stall_defaults.py::"
        "test_a_worker_frozen_in_a_short_reshard_is_named_within_90_s_by_default",
        "tests/flows/test_operator_view.py::"
        "test_run_log_holds_version_rows_shards_epochs_scores_and_registration",
        "tests/flows/test_pipeline.py::test_pipeline_reshards_trains_on_two_ranks_tracks_and_registers",
        "tests/flows/test_pipeline.py::test_second_pipeline_run_does_no_resharding",
        "tests/flows/test_real_data_pipeline.py::"
        "test_the_champion_predicts_on_raw_rows_as_batch_inference_does",
        "tests/flows/test_init_proposal.py::"
        "test_the_proposed_config_runs_end_to_end_and_serves_every_raw_row",
        "tests/flows/test_serve.py::test_serve_registers_schedules_runs_nightly_and_cancels_an_overlap",
        "tests/flows/test_serve.py::test_stopping_serve_pauses_its_deployments_and_says_so",
        "tests/flows/test_worker.py::test_worker_runs_the_shipped_file_with_one_overridden_field",
        "tests/flows/test_prefect_down.py::"
        "test_prefect_server_stopped_mid_reshard_rerun_reuses_the_version",
        "tests/test_secrets.py::test_no_file_or_output_of_a_pipeline_run_holds_a_credential",
        "tests/tracking/test_lifecycle.py::test_tracked_jobs_register_champion_then_challenger",
        "tests/tracking/test_outage.py::test_outage_mid_run_costs_time_only",
        "tests/tracking/test_outage.py::"
        "test_down_at_start_the_job_trains_and_an_upload_delivers_the_run",
        "tests/tracking/test_outage.py::"
        "test_down_through_the_job_and_log_model_delivered_at_the_close",
        "tests/training/test_ddp_kill_resume.py::"
        "test_sigkilled_ddp_job_resumes_exactly_where_its_checkpoint_was",
        "tests/training/test_distributed_launch.py::"
        "test_sigkilled_rank_fails_fast_and_the_retry_resumes_every_sample_once",
        "tests/training/test_distributed_launch.py::"
        "test_two_torchrun_nodes_on_localhost_train_the_same_steps",
        "tests/training/test_elastic_resume.py::"
        "test_two_rank_checkpoint_resumes_on_another_world_size",
        # a tracked 2-rank DDP job that two tests read: its setup counts in the first
        "tests/training/test_ddp_launch.py::test_two_rank_ddp_run_gives_equal_batches_per_rank",
        "tests/training/test_distributed.py::"
        "test_ddp_fsdp_and_tensor_parallel_train_resume_and_agree",
        # three reshards (each its own cluster), a rank process and the loaders, on tiny data
        "tests/test_benchmarks.py::test_each_benchmark_runs_at_its_smallest_size[loader_bench]",
        # a torchrun job whose rank is SIGSTOPped: the watchdog's timeout, torchrun's grace, a retry
        "tests/training/test_rank_hang.py::"
        "test_a_sigstopped_rank_fails_the_attempt_and_the_retry_trains_every_sample_once",
        "tests/training/test_rank_time.py::test_a_rank_made_slower_is_named_with_its_time_split",
        # whole pipeline runs under Prefect with MLflow: hostile names, the console, promotion
        "tests/flows/test_hostile_pipeline.py::"
        "test_hostile_column_names_train_register_and_predict_raw_rows",
        "tests/flows/test_console.py::"
        "test_a_pipeline_run_prints_at_most_40_lines_and_the_full_result_as_json",
        "tests/flows/test_promotion.py::test_an_easier_night_does_not_promote_a_worse_model",
        # jobs on the real one-host SLURM: the whole pipeline (a reshard on a SLURM worker
        # job, a 2-rank training job), a job run into its one-minute time limit (SLURM
        # counts in minutes)
        "tests/slurm/test_slurm_pipeline.py::"
        "test_the_pipeline_runs_its_dask_step_and_training_as_slurm_jobs",
        "tests/slurm/test_slurm_training.py::test_a_job_past_its_walltime_fails_naming_the_time_limit",
        # two pipeline runs read through MLflow's REST API (the nightly tier: `make nightly`)
        "tests/flows/test_mlflow_nights.py::"
        "test_two_nights_are_two_parents_in_training_mode_with_their_children",
        # nights of the incremental chain, each a reshard subprocess under a fault
        "tests/soak/test_soak.py::test_nightly_chain_survives_a_fault_a_night",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierChecks(END_TO_END), "ballast-tiers")
    config.addinivalue_line(
        "markers",
        "nightly: several pipelines or runs at once, or tasks of minutes; "
        f"run only with {NIGHTLY_VARIABLE}=1",
    )


def pytest_itemcollected(item: pytest.Item) -> None:
    mark_group(item)  # tests/parallel.py: which tests share a worker under xdist


@pytest.hookimpl(trylast=True)  # after xdist's own hook, which should add the suffix
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(NIGHTLY_VARIABLE) != "1":  # the nightly tier: `make nightly` only
        nightly = [item for item in items if item.get_closest_marker("nightly")]
        if nightly:
            config.hook.pytest_deselected(items=nightly)
            items[:] = [item for item in items if not item.get_closest_marker("nightly")]
    order_items(items, END_TO_END)
    if getattr(config.option, "loadgroup", False):
        suffix_groups(items)


@pytest.fixture(autouse=True)
def import_path_as_it_was() -> Iterator[None]:
    """Each test leaves `sys.path` as it found it. `mlflow.pyfunc.load_model` in a test puts
    the model's `code/` (a partial copy of ballast's packages) first on this process's path;
    every worker a later test starts with `LocalCluster` inherits that path and fails its
    imports (`No module named 'preprocessing.contract.slurm'`). ballast's own loads restore
    the path (tracking/run/model.own_import_path); a test calling MLflow directly does not."""
    before = list(sys.path)
    yield
    sys.path[:] = before


TINY = SampleSpec(
    num_rows=3_000,
    num_files=6,
    num_classes=4,
    num_sources=2,
    num_features=4,
    class_ratio=8.0,
    seed=3,
)


@pytest.fixture(scope="session")
def dask_client() -> Iterator[Client]:
    """Two worker processes, one thread each: the shape of this 2-core machine."""
    with local_cluster(2) as cluster, Client(cluster) as client:
        yield client


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six Parquet files of uneven size, four long-tailed classes, two sources."""
    directory = tmp_path_factory.mktemp("raw")
    write_sample(directory, TINY)
    return directory


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Iterator[str]:
    """A real `mlflow server` process on loopback for the whole session: sqlite backend,
    artifacts proxied to a bucket on moto's S3 server."""
    import fsspec

    from tests.services import mlflow_server

    fsspec.filesystem("s3").mkdir("mlflow-artifacts")
    with mlflow_server(tmp_path_factory.mktemp("mlflow"), "s3://mlflow-artifacts/") as uri:
        yield uri


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on loopback. Dask workers started before it do not see its
    environment, so S3 tests start their own cluster (run_reshard without a client)."""
    from tests.services import moto_s3

    with moto_s3() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def prefect_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated Prefect database that every Prefect server of the run starts from a copy
    of (tests/services.py), made once for all xdist workers, in their shared directory."""
    from tests.services import prefect_database as migrated

    base = tmp_path_factory.getbasetemp()
    return migrated(base.parent if "PYTEST_XDIST_WORKER" in os.environ else base)


@pytest.fixture(scope="session")
def prefect_harness(prefect_database: Path) -> Iterator[None]:
    """One Prefect test harness (a temporary API server and database) for every test that
    runs a flow in this process."""
    from tests.services import prefect_test_harness

    with prefect_test_harness(prefect_database, timeout_s=120):
        yield


@pytest.fixture(scope="session")
def cli_pipeline_run(
    tiny_raw: Path, tmp_path_factory: pytest.TempPathFactory, prefect_database: Path
) -> CliRun:
    """One `ballast run pipeline` command as a new user runs it, with credentials in its
    config (tests/cli_pipeline.py): the console and secrets tests both read it."""
    return run_cli_pipeline(tiny_raw, tmp_path_factory.mktemp("cli-pipeline"), prefect_database)


@pytest.fixture
def proxy(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultyS3Proxy]:
    """The fault-injecting proxy in front of moto (tests/fault_proxy.py); this process and
    the workers it starts go through it."""
    with FaultyS3Proxy(s3_endpoint) as running:
        monkeypatch.setenv("AWS_ENDPOINT_URL", running.url)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        s3fs.S3FileSystem.clear_instance_cache()
        yield running
    s3fs.S3FileSystem.clear_instance_cache()
