"""A failed job's message keeps each rank's traceback, however long torchrun's summary
after it (the cause was cut off in a CI log once)."""

from __future__ import annotations

from tests.training.job_output import job_failure, tracebacks

RANK_ERROR = """[rank0]: starting
Traceback (most recent call last):
  File "job.py", line 3, in <module>
    main()
ValueError: rank 0 saw a bad thing
"""


def test_the_traceback_survives_a_long_summary_after_it() -> None:
    """The exception line and the frame above it are in the message although 20,000
    characters of torchrun's summary follow them; the output's tail is kept too."""
    summary = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 20000
    message = job_failure("noise\n" + RANK_ERROR + summary + "\nthe end")
    assert "ValueError: rank 0 saw a bad thing" in message and 'File "job.py"' in message
    assert message.endswith("the end")


def test_each_traceback_is_cut_at_its_exception_and_repeats_are_kept_once() -> None:
    """Two ranks printing the same traceback give one block, ending at the exception."""
    blocks = tracebacks(RANK_ERROR + RANK_ERROR + "unrelated line\n")
    assert len(blocks) == 2 and blocks[0].endswith("ValueError: rank 0 saw a bad thing")
    causes = job_failure(RANK_ERROR + RANK_ERROR).split("--- the output's tail")[0]
    assert causes.count("ValueError") == 1


def test_no_traceback_is_said_so() -> None:
    """An output without a traceback says so instead of showing an empty cause."""
    assert "no Python traceback" in job_failure("exitcode: -9 (SIGKILL)")
