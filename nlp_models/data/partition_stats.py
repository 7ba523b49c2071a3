"""How non-IID a partition is: a per-client table, a one-line summary and FedNLP-style bar plots.

For client i with label distribution p_i and the corpus's global distribution q:

    entropy_bits  = -sum_c p_ic log2 p_ic                       (0: one label; log2 C: uniform)
    tv_to_global  = 1/2 sum_c |p_ic - q_c|                       (0: IID proportions; max 1 - min_c q_c)
    js_to_global  = 1/2 KL(p_i || m) + 1/2 KL(q || m), m = (p_i + q) / 2, in bits (in [0, 1])

Without labels only sizes are reported (quantity skew). Empty clients have no label distribution:
their label columns are None and the summary's means skip them. The plot draws one panel per
partition with each client's label counts as a stacked horizontal bar, as FedNLP's (Lin et al.
2022) partition figures do; it needs matplotlib and renders with Agg, touching no pyplot state.
"""
from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nlp_models.data.partition import Partition

Row = dict[str, Any]

SIZE_COLUMNS = ("client", "examples", "share")
LABEL_COLUMNS = ("labels_held", "entropy_bits", "tv_to_global", "js_to_global")


def _entropy_bits(p: np.ndarray) -> float:
    nz = p[p > 0]
    return float(-(nz * np.log2(nz)).sum()) + 0.0  # + 0.0 turns -0.0 into 0.0


def _kl_bits(p: np.ndarray, q: np.ndarray) -> float:
    nz = p > 0
    return float((p[nz] * np.log2(p[nz] / q[nz])).sum())


def _js_bits(p: np.ndarray, q: np.ndarray) -> float:
    m = (p + q) / 2
    return max(0.0, 0.5 * _kl_bits(p, m) + 0.5 * _kl_bits(q, m))


def _label_counts(partition: Partition, labels: np.ndarray | Sequence[int], num_labels: int | None) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != partition.n:
        raise ValueError(f"need one label per example ({partition.n}), got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integer class ids, got dtype {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise ValueError("labels must be non-negative class ids")
    needed = int(labels.max()) + 1 if labels.size else 0
    if num_labels is None:
        num_labels = needed
    elif num_labels < needed:
        raise ValueError(f"num_labels={num_labels} but labels go up to {needed - 1}")
    return partition.label_counts(labels, max(num_labels, 1))


def partition_table(partition: Partition, *, labels: np.ndarray | Sequence[int] | None = None,
                    num_labels: int | None = None) -> list[Row]:
    """One row per client (ids 1-based, as the engine numbers clients): size, share of the corpus
    and, given labels, labels held, entropy and distances to the global label distribution.
    A natural partition's rows also carry the client's `key`. `num_labels` defaults to max label + 1."""
    sizes = partition.sizes
    rows: list[Row] = []
    for i, size in enumerate(sizes):
        row: Row = {"client": i + 1}
        if partition.keys is not None:
            row["key"] = partition.keys[i]
        row["examples"] = int(size)
        row["share"] = float(size / partition.n) if partition.n else 0.0
        rows.append(row)
    if labels is None:
        return rows
    counts = _label_counts(partition, labels, num_labels)
    total = counts.sum(axis=0)
    global_p = total / total.sum() if total.sum() else total.astype(np.float64)
    for row, c in zip(rows, counts):
        if c.sum() == 0:
            row.update(labels_held=0, entropy_bits=None, tv_to_global=None, js_to_global=None)
            continue
        p = c / c.sum()
        row.update(labels_held=int(np.count_nonzero(c)), entropy_bits=_entropy_bits(p),
                   tv_to_global=float(0.5 * np.abs(p - global_p).sum()), js_to_global=_js_bits(p, global_p))
    return rows


def partition_summary(partition: Partition, *, labels: np.ndarray | Sequence[int] | None = None,
                      num_labels: int | None = None) -> dict[str, Any]:
    """Client count, size spread (min/median/max, coefficient of variation std/mean with ddof 0)
    and, given labels, the mean entropy, TV and JS distance over non-empty clients."""
    sizes = partition.sizes.astype(np.float64)
    mean = sizes.mean()
    summary: dict[str, Any] = {
        "method": partition.method, "clients": len(partition), "examples": partition.n,
        "min_size": int(sizes.min()), "median_size": float(np.median(sizes)), "max_size": int(sizes.max()),
        "size_cv": float(sizes.std() / mean) if mean else 0.0,
    }
    if labels is None:
        return summary
    rows = [r for r in partition_table(partition, labels=labels, num_labels=num_labels) if r["examples"]]
    for name, column in (("mean_labels_held", "labels_held"), ("mean_entropy_bits", "entropy_bits"),
                         ("mean_tv_to_global", "tv_to_global"), ("mean_js_to_global", "js_to_global")):
        summary[name] = float(np.mean([r[column] for r in rows])) if rows else None
    return summary


def summary_line(summary: Mapping[str, Any]) -> str:
    """`partition_summary` as one log line."""
    line = (f"{summary['method']}: {summary['clients']} clients, sizes {summary['min_size']}/"
            f"{summary['median_size']:g}/{summary['max_size']} (min/median/max), CV {summary['size_cv']:.3f}")
    if summary.get("mean_tv_to_global") is not None:
        line += (f", mean TV to global {summary['mean_tv_to_global']:.3f}, mean entropy "
                 f"{summary['mean_entropy_bits']:.3f} bits, mean labels held {summary['mean_labels_held']:.2f}")
    return line


def _columns(rows: Sequence[Row]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    return columns


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def write_partition_table(rows: Sequence[Row], *, path_csv: str | Path, path_md: str | Path) -> tuple[Path, Path]:
    """Write `partition_table` rows as CSV (full precision; None as an empty cell) and as a Markdown
    table (4 decimals, numbers right-aligned); returns both paths. Parent folders are created."""
    if not rows:
        raise ValueError("no rows to write")
    columns = _columns(rows)
    path_csv, path_md = Path(path_csv), Path(path_md)
    for path in (path_csv, path_md):
        path.parent.mkdir(parents=True, exist_ok=True)
    with path_csv.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({k: ("" if row.get(k) is None else row[k]) for k in columns} for row in rows)

    def md(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    numeric = [all(isinstance(r.get(k), (int, float)) or r.get(k) is None for r in rows) for k in columns]
    lines = ["| " + " | ".join(md(k) for k in columns) + " |",
             "|" + "|".join("---:" if num else "---" for num in numeric) + "|"]
    lines += ["| " + " | ".join(md(_cell(row.get(k))) for k in columns) + " |" for row in rows]
    path_md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path_csv, path_md


def plot_partitions(partitions: Mapping[str, Partition], *, labels: np.ndarray | Sequence[int] | None = None,
                    num_labels: int | None = None, label_names: Sequence[str] | None = None,
                    path: str | Path) -> Path:
    """One panel per named partition (of the same corpus): a horizontal bar per client, stacked by
    label count (or plain sizes without labels), client 1 on top. Saved as PNG; returns `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not partitions:
        raise ValueError("no partitions to plot")
    counts = {name: (_label_counts(p, labels, num_labels) if labels is not None else p.sizes[:, None])
              for name, p in partitions.items()}
    classes = next(iter(counts.values())).shape[1]
    if labels is not None and label_names is not None and len(label_names) != classes:
        raise ValueError(f"{len(label_names)} label names for {classes} labels")
    names = list(label_names) if label_names is not None else [str(c) for c in range(classes)]
    most = max(len(p) for p in partitions.values())
    fig = Figure(figsize=(4.2 * len(partitions), max(2.5, 0.22 * most + 1.5)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(partitions), squeeze=False)[0]
    colors = [f"C{c % 10}" for c in range(classes)]
    for ax, (title, c) in zip(axes, counts.items()):
        ids = np.arange(1, len(c) + 1)
        left = np.zeros(len(c))
        for k in range(classes):
            ax.barh(ids, c[:, k], left=left, color=colors[k] if labels is not None else "C0",
                    label=names[k] if labels is not None else None, height=0.8)
            left += c[:, k]
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("examples")
        ax.set_ylabel("client")
        ax.set_ylim(len(c) + 0.6, 0.4)  # client 1 on top
        if len(c) <= 30:
            ax.set_yticks(ids)
    if labels is not None:
        handles, legend_labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, legend_labels, loc="outside right upper", title="label", fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=120)
    return path
