"""A watchdog in every rank: no train step for `hang_timeout_s` fails the attempt, naming
the ranks that are stuck, instead of leaving the job hanging.

`HangWatchdog` (a Lightning callback, on every rank of a job of several) notes each
finished train batch; its thread beats every `beat_s`: it publishes this rank's
"<global step> <beat count>" under `ballast/heartbeat/<rank>` in the job's TCPStore
(the rendezvous store at MASTER_ADDR:MASTER_PORT that torchrun and Lightning set up;
one small write a beat, no file on shared storage) and checks this rank's progress.
Validation is not watched (its steps are not train steps); checkpoint writes between
steps are, so the timeout must exceed the longest of them.

When this rank has made no progress for the timeout, the thread reads every peer's
heartbeat twice, a few beats apart: a peer whose beat count did not move is silent
(stopped, SIGSTOPped, dead, or its host gone), a peer at a lower step is behind (still
computing while this rank waits in all-reduce). It prints one line naming them, leaves
it for the launcher (training/distributed/hangs.py) and ends the process with
HANG_STATUS; torchrun then stops the other ranks and the launcher's retry resumes from
the last checkpoint (training/launch/job.py). A live rank waiting in all-reduce for a
stopped peer thus names that peer; a rank itself wedged in compute names no peer, and
says so. The timeout defaults to 90 % of the collective timeout, so that the watchdog,
which can name the stuck rank, fires before the collective's own error, which cannot.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import lightning
import torch.distributed as dist

from training.distributed.hangs import HANG_STATUS, write_hang_report

KEY = "ballast/heartbeat/{rank}"
STORE_TIMEOUT_S = 10.0
REPORT_GRACE_S = 30.0


class HangWatchdog(lightning.Callback):
    """Notes train progress for its `Watchdog` thread (see the module)."""

    def __init__(self, timeout_s: float, output_dir: str) -> None:
        self.timeout_s, self.output_dir = timeout_s, output_dir
        self.thread: Watchdog | None = None

    def on_train_start(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        self.thread = Watchdog(
            self.timeout_s,
            self.output_dir,
            trainer.global_rank,
            trainer.world_size,
            trainer.global_step,
        )
        self.thread.start()

    def on_train_batch_end(self, trainer: lightning.Trainer, *args: Any) -> None:
        if self.thread is not None:
            self.thread.progress(trainer.global_step)

    def on_validation_start(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        if self.thread is not None:
            self.thread.paused = True

    def on_validation_end(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        if self.thread is not None:
            self.thread.progress(trainer.global_step)
            self.thread.paused = False

    def on_train_end(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        self.stop()

    def on_exception(
        self, trainer: lightning.Trainer, pl_module: Any, error: BaseException
    ) -> None:
        self.stop()

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.stopped.set()
            self.thread.join()
            self.thread = None


class Watchdog(threading.Thread):
    """Beats, publishes this rank's heartbeat, and fails the process when it is stuck."""

    def __init__(
        self, timeout_s: float, output_dir: str, rank: int, world_size: int, step: int
    ) -> None:
        super().__init__(name=f"hang-watchdog-rank{rank}", daemon=True)
        self.timeout_s, self.output_dir = timeout_s, output_dir
        self.rank, self.world_size, self.step = rank, world_size, step
        self.beat_s = min(1.0, timeout_s / 5)
        self.last_progress, self.paused, self.beats = time.monotonic(), False, 0
        self.stopped = threading.Event()

    def progress(self, step: int) -> None:
        self.step, self.last_progress = step, time.monotonic()

    def run(self) -> None:
        store = connect_store()
        while not self.stopped.wait(self.beat_s):
            self.beats += 1
            publish(store, self.rank, f"{self.step} {self.beats}")
            if not self.paused and time.monotonic() - self.last_progress > self.timeout_s:
                self.fail(
                    stuck_peers(store, self.rank, self.world_size, self.step, 3 * self.beat_s)
                )

    def fail(self, stuck: str) -> None:
        """Report the hang in one line, on stderr and for the launcher; end the process."""
        line = (
            f"hang on rank {self.rank}: no train step for {self.timeout_s:g} s after "
            f"global step {self.step}; stuck: {stuck}"
        )
        print(line, file=sys.stderr, flush=True)
        # The report goes to output_dir, maybe object storage: a write that hangs too must
        # not keep the process alive.
        threading.Timer(REPORT_GRACE_S, os._exit, args=(HANG_STATUS,)).start()
        try:
            write_hang_report(self.output_dir, self.rank, line)
        finally:
            os._exit(HANG_STATUS)  # the main thread is blocked in a collective: no unwinding


def connect_store() -> dist.Store | None:
    """A client of the job's rendezvous store, or None where there is none to reach."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if host is None or port is None:
        return None
    try:
        return dist.TCPStore(
            host,
            int(port),
            is_master=False,
            wait_for_workers=False,
            timeout=timedelta(seconds=STORE_TIMEOUT_S),
        )
    except (RuntimeError, ValueError):  # unreachable: the watchdog still fails a hang
        return None


def publish(store: dist.Store | None, rank: int, value: str) -> None:
    try:
        if store is not None:
            store.set(KEY.format(rank=rank), value)
    except RuntimeError:
        pass  # the store's host may be the stuck one; the peers' watchdogs still fire


def read_beats(store: dist.Store | None, world_size: int) -> dict[int, tuple[int, int]]:
    """(step, beat count) of every rank that published one and can be read now."""
    beats: dict[int, tuple[int, int]] = {}
    for rank in range(world_size):
        try:
            key = KEY.format(rank=rank)
            if store is not None and store.check([key]):
                step, count = store.get(key).decode().split()
                beats[rank] = (int(step), int(count))
        except (RuntimeError, ValueError):
            continue
    return beats


def stuck_peers(
    store: dist.Store | None, rank: int, world_size: int, step: int, wait_s: float
) -> str:
    """Which peers are silent (no beat during `wait_s`) or behind this rank's step."""
    if store is None:
        return "unknown (no rendezvous store to read the peers' heartbeats from)"
    before = read_beats(store, world_size)
    time.sleep(wait_s)
    after = read_beats(store, world_size)
    named = []
    for peer in (r for r in range(world_size) if r != rank):
        if peer not in after:
            named.append(f"rank {peer} (no heartbeat readable)")
        elif before.get(peer) == after[peer]:
            named.append(
                f"rank {peer} (silent for {wait_s:g} s; last heartbeat at step {after[peer][0]})"
            )
        elif after[peer][0] < step:
            named.append(f"rank {peer} (behind, at step {after[peer][0]})")
    if named:
        return ", ".join(named)
    return f"no peer is silent or behind: this rank itself, or every rank, at step {step}"
