"""The oracle of benchmarks/hetero_bench.py: fixed splits swept by hand, the fastest of
them `best fixed`, and every `speed` figure as a ratio to it beside the ratio to `equal`.

A slowed node's case (`loaded`, `midslow`) runs, after its `equal` run, `loader.balance:
fixed` at `--sweep` splits evenly spaced from equal (excluded: that is the `equal` run)
to the rows-proportional split, then `--sweep-beyond` more at the same spacing past it
(a slow rank's fixed cost is slow too, so the best split can lie beyond the split that
equalises only the cost per row). The rows-proportional split is the fast rank's share
1/busy_0 / (1/busy_0 + 1/busy_1) of the `equal` run's busy time a step (the slowed node
is rank 1), or `--sweep-to` rows (on a host loaded by others both ranks are slowed and
that split comes near equal): from the `loaded` run of the same model and repeat where
there is one (a mid-run slow-down's `equal` run mixes both speeds). The fastest over all
epochs (`equal` included) is `best fixed`; the first epoch is compared against the same
run's first.
"""

from __future__ import annotations

from statistics import median
from typing import Any

Run = dict[str, Any]
SWEPT_CASES = ("loaded", "midslow")


def fixed_name(model: str, case: str, fast_rows: int) -> str:
    return f"{model}fixed{fast_rows}-{case}"


def proportional_share(equal: Run) -> float:
    """The fast rank's (rank 0's) share of the rows under a split by rows per busy second."""
    busy = equal["per_rank"]["busy_s"]
    return (1 / busy[0]) / (1 / busy[0] + 1 / busy[1])


def swept_rows(
    equal: Run, global_batch: int, between: int, beyond: int, to_rows: int | None = None
) -> list[int]:
    """The fast rank's rows a step at each split swept (ascending, distinct, leaving the
    slow rank at least one row; the equal split excluded), up to `to_rows` (by default the
    rows-proportional split) and `beyond` steps past it."""
    half = global_batch // 2
    end = to_rows if to_rows is not None else proportional_share(equal) * global_batch
    step = (end - half) / between
    rows = {round(half + step * k) for k in range(1, between + beyond + 1)}
    return sorted(r for r in rows if half < r < global_batch)


def fixed_shares(fast_rows: int, global_batch: int) -> list[float]:
    return [fast_rows / global_batch, (global_batch - fast_rows) / global_batch]


def best_fixed(results: dict[str, list[Run]], model: str, case: str, repeat: int) -> Run | None:
    """The fastest run over all epochs of the case's `equal` and fixed splits in `repeat`,
    its name under "name"; None when no split was swept."""
    prefix, suffix = f"{model}fixed", f"-{case}"
    names = [n for n in results if n.startswith(prefix) and n.endswith(suffix)]
    runs = [(n, results[n][repeat]) for n in names if len(results[n]) > repeat]
    if not runs:
        return None
    runs.append((f"{model}equal-{case}", results[f"{model}equal-{case}"][repeat]))
    name, run = min(runs, key=lambda pair: sum(pair[1]["epoch_wall_s"]))
    return run | {"name": name}


def sweep_table(results: dict[str, list[Run]], model: str, case: str) -> None:
    """Every split swept: rows of the fast rank, first-epoch and all-epoch wall (median
    over repeats) and their ratio to `equal`'s."""
    equal = results.get(f"{model}equal-{case}")
    prefix, suffix = f"{model}fixed", f"-{case}"
    names = sorted(
        (n for n in results if n.startswith(prefix) and n.endswith(suffix)),
        key=lambda n: int(n[len(prefix) : -len(suffix)]),
    )
    if equal is None or not names:
        return
    print(f"\n  sweep, {model or 'mlp-'}{case}: fast rows | first epoch s | all s | / equal")
    for name in [f"{model}equal-{case}", *names]:
        runs, rows = results[name], name[len(prefix) : -len(suffix)] or "equal"
        first = median(run["epoch_wall_s"][0] for run in runs)
        total = median(sum(run["epoch_wall_s"]) for run in runs)
        ratio = median(
            sum(r["epoch_wall_s"]) / sum(e["epoch_wall_s"])
            for r, e in zip(runs, equal, strict=False)
        )
        print(f"    {rows:>6} | {first:8.2f} | {total:8.2f} | {ratio:.3f}x")


def against_best(results: dict[str, list[Run]], model: str, case: str) -> str:
    """`speed` / best fixed (first epoch, all epochs; median over repeats, each repeat's
    speed over the same repeat's best fixed) and which split was best, or "" unswept."""
    speed = results.get(f"{model}speed-{case}", [])
    firsts, totals, best_names = [], [], []
    for repeat, run in enumerate(speed):
        best = best_fixed(results, model, case, repeat)
        if best is None:
            return ""
        firsts.append(run["epoch_wall_s"][0] / best["epoch_wall_s"][0])
        totals.append(sum(run["epoch_wall_s"]) / sum(best["epoch_wall_s"]))
        best_names.append(best["name"])
    if not firsts:
        return ""
    return (
        f"speed / best fixed {median(firsts):.3f}x first epoch "
        f"({', '.join(f'{r:.3f}' for r in firsts)}), {median(totals):.3f}x all "
        f"({', '.join(f'{r:.3f}' for r in totals)}); best fixed {best_names} "
        "(targets <= 1.10x first epoch, <= 1.05x over 3 epochs)"
    )


def against_median_best(results: dict[str, list[Run]], model: str, case: str) -> str:
    """`speed`'s median (first epoch, all epochs) over that of the split fastest by its
    median over repeats (all epochs), or "" under 2 repeats or unswept. Each repeat's
    best fixed is the least of several runs, each off by the host's noise between runs,
    so it sits below what that split takes on average, while a speed run is one draw:
    against it even a speed run at the best split measures over 1x. A split's median
    over repeats is not biased so."""
    speed = results.get(f"{model}speed-{case}", [])
    names = [n for n in results if n.startswith(f"{model}fixed") and n.endswith(f"-{case}")]
    names.append(f"{model}equal-{case}")
    splits = {n: results[n] for n in names if len(results.get(n, [])) == len(speed)}
    if len(speed) < 2 or len(splits) < 2:
        return ""

    def total(runs: list[Run]) -> float:
        return median(sum(run["epoch_wall_s"]) for run in runs)

    def first(runs: list[Run]) -> float:
        return median(run["epoch_wall_s"][0] for run in runs)

    name = min(splits, key=lambda n: total(splits[n]))
    return (
        f"speed / the split fastest by its median over repeats ({name}): "
        f"{first(speed) / first(splits[name]):.3f}x first epoch, "
        f"{total(speed) / total(splits[name]):.3f}x all"
    )
