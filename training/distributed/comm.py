"""DDP gradient communication that is measured: comm hooks wrapped with a meter.

Every option of `CommConfig.hook` is a DDP comm hook registered on any device
(training/distributed/strategy.py; Lightning itself registers hooks only on CUDA,
docs/architecture.md M2), and every hook counts the bytes of the tensors it
actually all-reduces and times each all-reduce from launch to completion:

- `none`: the gradient bucket itself (what DDP does without a hook);
- `fp16` / `bf16`: a half-width copy of the bucket, so exactly half the bytes;
- `powersgd`: torch's PowerSGD hook (error feedback, warm start); after
  `warmup_steps` plain steps it all-reduces the low-rank factors P and Q
  ((n + m) x rank per compressed matrix) plus the tensors not worth compressing,
  counted from the hook's own `total_numel_after_compression`;
- `post_local_sgd`: plain all-reduce for `warmup_steps`, then none at all; the
  parameters are averaged every `local_sgd_period` optimizer steps by a
  `MeteredAverager`, whose all-reduce is counted the same way.

`CommMeter` keeps the totals; training/callbacks.py logs them per step as
`comm/allreduce_bytes`, `comm/allreduce_s` and `comm/compute_comm_ratio`. It also
keeps each all-reduce's (launch, completion) span, which training/distributed/rank_time.py
splits into the part hidden behind backward and the part the step is blocked on.
Bytes are the payload each rank contributes (a ring all-reduce moves about
twice that over the wire). Seconds add up each all-reduce's launch-to-completion
time, which overlaps backward compute; on CUDA, futures complete when NCCL
work is enqueued on the stream, so the figure is a lower bound there.
"""

# No `from __future__ import annotations` here: DDP's `register_comm_hook` compares a hook's
# annotations with `dist.GradBucket` and `Future[Tensor]` themselves, and refuses strings.

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from training.config import CommConfig


class Span(NamedTuple):
    """One all-reduce: launched, completed (perf_counter seconds), and whether a comm hook
    launched it during backward."""

    started: float
    ended: float
    in_backward: bool


Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


class CommMeter:
    """Bytes all-reduced and seconds spent, since the last `take()` and in total."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes, self.seconds = 0, 0.0
        self.total_bytes, self.total_seconds = 0, 0.0
        self.spans: list[Span] = []

    def add(self, num_bytes: int = 0, seconds: float = 0.0) -> None:
        with self._lock:
            self.bytes += num_bytes
            self.seconds += seconds
            self.total_bytes += num_bytes
            self.total_seconds += seconds

    def add_span(self, started: float, ended: float, in_backward: bool) -> None:
        """One all-reduce from launch to completion (perf_counter seconds). `in_backward`:
        launched by a comm hook, so it may overlap backward; else the step waits all of it."""
        with self._lock:
            self.spans.append(Span(started, ended, in_backward))

    def take_spans(self) -> list[Span]:
        """The spans since the previous call; resets them."""
        with self._lock:
            taken, self.spans = self.spans, []
            return taken

    def take(self) -> tuple[int, float]:
        """(bytes, seconds) since the previous call; resets them."""
        with self._lock:
            taken = (self.bytes, self.seconds)
            self.bytes, self.seconds = 0, 0.0
            return taken

    def allreduce(self, tensor: torch.Tensor, group: Any = None) -> torch.futures.Future[Any]:
        """All-reduce `tensor` (sum, async), counted and timed; the future's value is it."""
        self.add(tensor.numel() * tensor.element_size())
        return self.timed(dist.all_reduce(tensor, group=group, async_op=True).get_future())

    def timed(
        self, future: torch.futures.Future[Any], started: float | None = None
    ) -> torch.futures.Future[Any]:
        """`future`, with its time from `started` (default now) to completion metered."""
        started = time.perf_counter() if started is None else started

        def done(fut: torch.futures.Future[Any]) -> Any:
            ended = time.perf_counter()
            self.add(seconds=ended - started)
            self.add_span(started, ended, in_backward=True)
            value = fut.value()
            return value[0] if isinstance(value, list) else value

        return future.then(done)


def allreduce_hook(meter: CommMeter) -> Hook:
    """The bucket all-reduced as it is, then averaged."""

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer().div_(dist.get_world_size(state))
        return meter.allreduce(buffer, state)

    return hook


def compressed_hook(meter: CommMeter, dtype: torch.dtype) -> Hook:
    """A `dtype` copy of the bucket all-reduced, averaged, and copied back."""

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        compressed = buffer.to(dtype).div_(dist.get_world_size(state))

        def decompress(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            buffer.copy_(fut.value())
            return buffer

        return meter.allreduce(compressed, state).then(decompress)

    return hook


def powersgd_hook(meter: CommMeter) -> Hook:
    """torch's PowerSGD hook, counting what it all-reduces (see the module docstring)."""

    def hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        warming_up = state.iter < state.start_powerSGD_iter
        before, started = state.total_numel_after_compression, time.perf_counter()
        future = meter.timed(powerSGD_hook(state, bucket), started)
        numel = buffer.numel() if warming_up else state.total_numel_after_compression - before
        meter.add(numel * buffer.element_size())
        return future

    return hook


def local_sgd_hook(meter: CommMeter) -> Hook:
    """All-reduce during the warm-up, then nothing: ranks step on their own gradients."""
    plain = allreduce_hook(meter)

    def hook(
        state: PostLocalSGDState, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        if state.iter < state.start_localSGD_iter:
            state.maybe_increase_iter(bucket)
            return plain(state.process_group, bucket)
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    return hook


def build_hook(config: CommConfig, meter: CommMeter) -> tuple[Any, Hook]:
    """(state, hook) for DDP's `register_comm_hook`; the default process group throughout."""
    if config.hook in HALF:
        return None, compressed_hook(meter, HALF[config.hook])
    if config.hook == "powersgd":
        powersgd = PowerSGDState(
            process_group=None,
            matrix_approximation_rank=config.powersgd_rank,
            start_powerSGD_iter=config.warmup_steps,
        )
        return powersgd, powersgd_hook(meter)
    if config.hook == "post_local_sgd":
        local = PostLocalSGDState(None, None, config.warmup_steps, False)
        return local, local_sgd_hook(meter)
    return None, allreduce_hook(meter)


class MeteredAverager(PeriodicModelAverager):
    """Periodic parameter averaging (post-local SGD) whose all-reduce is counted and timed."""

    def __init__(self, period: int, warmup_steps: int, meter: CommMeter) -> None:
        super().__init__(period=period, warmup_steps=warmup_steps)
        self.meter = meter

    def average_parameters(self, params: Iterable[Any]) -> None:
        params = list(params)
        due = self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0
        started = time.perf_counter()
        super().average_parameters(params)
        if due:
            sent, ended = sum(p.numel() * p.element_size() for p in params), time.perf_counter()
            self.meter.add(sent, ended - started)
            self.meter.add_span(started, ended, in_backward=False)
