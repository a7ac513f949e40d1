"""`ballast demo`: generate a skewed sample, then run the whole pipeline on it locally."""

from __future__ import annotations

import time
from pathlib import Path

from flows.cli.summary import format_result
from flows.params import PipelineParams, load_preset, parse_params
from flows.pipeline import pipeline
from flows.results import PipelineResult
from preprocessing.synthetic.tabular import SampleSpec, write_sample


def run_demo(
    work_dir: str | Path, num_rows: int = 120_000, seed: int = 0
) -> tuple[PipelineParams, PipelineResult, float]:
    """Write the sample under `work_dir`, run `pipeline`; its params, result and seconds."""
    work_dir = Path(work_dir).resolve()
    start = time.perf_counter()
    raw = work_dir / "raw"
    if not raw.exists():  # the sample is deterministic: an existing one is the same data
        write_sample(raw, SampleSpec(num_rows=num_rows, seed=seed))
    params = parse_params(PipelineParams, load_preset("demo", work_dir), "demo")
    result = pipeline(**params.arguments())
    return params, result, time.perf_counter() - start


def demo_summary(params: PipelineParams, result: PipelineResult, seconds: float) -> str:
    """The pipeline's summary, with how long the demo took."""
    return f"{format_result(params, result)}\ndemo finished in {seconds:.0f} s"
