"""What the grid modules share to summarise cells: group rows, mean ± sample std over seeds, and the
learning-curve figure (one line per method, the mean over seeds)."""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dp.leakage.stats import mean_ci


def grouped(rows: Iterable[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], Hashable]) -> dict[Hashable, list]:
    """Rows by `key(row)`, in order of first appearance."""
    out: dict[Hashable, list] = {}
    for row in rows:
        out.setdefault(key(row), []).append(row)
    return out


def summarise(entry: dict[str, Any], series: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """entry[k] = mean of series[k], entry[k + '_std'] = its sample std (0 for a single seed)."""
    for key, values in series.items():
        entry[key] = float(np.mean(values))
        entry[f"{key}_std"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return entry


def paired_difference(ours: Mapping[Hashable, float], theirs: Mapping[Hashable, float], *,
                      level: float = 0.95) -> dict[str, float] | None:
    """ours - theirs paired by key (a seed: same split, same initial model): the mean difference and its
    Student-t interval over the common keys (low/high nan with one), or None when they share no key."""
    common = [k for k in ours if k in theirs]
    if not common:
        return None
    mean, low, high = mean_ci([ours[k] - theirs[k] for k in common], level=level)
    return {"mean": mean, "low": low, "high": high, "seeds": len(common)}


def fewest_seeds(std: float, *, half_width: float, level: float = 0.95, most: int = 10_000) -> int | None:
    """The fewest seeds n >= 2 whose Student-t interval of a mean (sample std `std`) has a half-width below
    `half_width`: t_{(1+level)/2, n-1} std / sqrt(n) < half_width. None when `std` is not finite, the target
    is not positive, or more than `most` would be needed. The one rule behind every 'seeds needed'."""
    import math

    from scipy import stats

    if not math.isfinite(std) or not half_width > 0:
        return None
    for n in range(2, most + 1):
        if float(stats.t.ppf(0.5 + level / 2, df=n - 1)) * std / math.sqrt(n) < half_width:
            return n
    return None


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_mean_curves(ax: Any, rows: Sequence[Mapping[str, Any]], methods: Sequence[str], *,
                     first: Callable[[str], int] = lambda method: 1) -> None:
    """Per method (in `methods` order), the mean over its rows of `row['curve']` (x 100), from round `first(method)`.
    A method's colour follows its place in `methods`, so it is the same in every panel even where
    another method has no rows."""
    palette = [f"C{i}" for i in range(10)] if len(methods) <= 10 else [pyplot().get_cmap("tab20")(i) for i in range(20)]
    for i, method in enumerate(methods):
        curves = [r["curve"] for r in rows if r["method"] == method and r["curve"]]
        if curves:
            mean = np.mean(np.asarray(curves, dtype=float), axis=0)
            start = first(method)
            ax.plot(range(start, start + len(mean)), 100 * mean, marker="o", markersize=3, label=method,
                    color=palette[i % len(palette)])


def save_figure(fig: Any, path: Path, *, legend: bool = True) -> Path:
    """Grid, a legend on every axis (unless the caller placed its own: `legend=False`), integer ticks on
    an x axis labelled 'round...' (rounds are whole: no 1.5), tight layout, 120 dpi, closed."""
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if ax.get_xlabel().startswith("round"):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if legend:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


__all__ = ["grouped", "summarise", "paired_difference", "pyplot", "plot_mean_curves", "save_figure"]
