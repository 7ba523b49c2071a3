"""Partition statistics: hand-counted tables, the extremes of entropy and TV, written files, the plot."""
import csv
import math

import numpy as np
import pytest

from nlp_models.data.partition import Partition, dirichlet_label_skew, iid_partition, natural_partition
from nlp_models.data.partition_stats import (partition_summary, partition_table, plot_partitions, summary_line,
                                             write_partition_table)

# 10 examples, 3 labels; global distribution (4, 3, 3) / 10
LABELS = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
TINY = Partition((np.array([0, 1, 2]), np.array([3, 4, 7]), np.array([5, 6, 8, 9])), 10, "hand")


def test_table_matches_hand_counts():
    rows = partition_table(TINY, labels=LABELS, num_labels=3)
    assert [r["client"] for r in rows] == [1, 2, 3]
    assert [r["examples"] for r in rows] == [3, 3, 4]
    assert [r["share"] for r in rows] == pytest.approx([0.3, 0.3, 0.4])
    assert [r["labels_held"] for r in rows] == [1, 3, 2]
    q = np.array([0.4, 0.3, 0.3])
    # client 2 holds one of each label; client 3 two of label 1 and two of label 2
    assert rows[1]["entropy_bits"] == pytest.approx(math.log2(3))
    assert rows[2]["entropy_bits"] == pytest.approx(1.0)
    assert rows[1]["tv_to_global"] == pytest.approx(0.5 * np.abs(np.full(3, 1 / 3) - q).sum())
    assert rows[2]["tv_to_global"] == pytest.approx(0.5 * (0.4 + 0.2 + 0.2))
    p, m = np.array([0, 0.5, 0.5]), (np.array([0, 0.5, 0.5]) + q) / 2
    js = 0.5 * sum(a * math.log2(a / b) for a, b in zip(p, m) if a) + 0.5 * sum(a * math.log2(a / b) for a, b in zip(q, m))
    assert rows[2]["js_to_global"] == pytest.approx(js)


def test_single_label_client_has_zero_entropy_and_the_largest_distance():
    rows = partition_table(TINY, labels=LABELS, num_labels=3)
    single = rows[0]  # only label 0
    assert single["entropy_bits"] == 0.0
    assert single["tv_to_global"] == pytest.approx(1 - 0.4)  # a point mass at c is 1 - q_c from q
    assert single["tv_to_global"] == max(r["tv_to_global"] for r in rows)
    assert single["js_to_global"] == max(r["js_to_global"] for r in rows)
    # a client holding only the rarest label is as far from the global distribution as any can be
    rare = Partition((np.array([0, 1, 2, 3, 4, 5, 6]), np.array([7, 8, 9])), 10, "rare")
    far = partition_table(rare, labels=LABELS)[1]
    assert far["entropy_bits"] == 0.0 and far["tv_to_global"] == pytest.approx(1 - 0.3)


def test_without_labels_only_sizes():
    rows = partition_table(TINY, labels=None, num_labels=None)
    assert rows == [{"client": 1, "examples": 3, "share": 0.3}, {"client": 2, "examples": 3, "share": 0.3},
                    {"client": 3, "examples": 4, "share": 0.4}]
    summary = partition_summary(TINY)
    assert summary["min_size"] == 3 and summary["median_size"] == 3 and summary["max_size"] == 4
    assert summary["size_cv"] == pytest.approx(np.std([3, 3, 4]) / np.mean([3, 3, 4]))
    assert "mean_tv_to_global" not in summary and "TV" not in summary_line(summary)


def test_summary_averages_the_table():
    rows = partition_table(TINY, labels=LABELS)
    summary = partition_summary(TINY, labels=LABELS, num_labels=3)
    assert summary["clients"] == 3 and summary["examples"] == 10 and summary["method"] == "hand"
    assert summary["mean_tv_to_global"] == pytest.approx(np.mean([r["tv_to_global"] for r in rows]))
    assert summary["mean_entropy_bits"] == pytest.approx((0 + math.log2(3) + 1) / 3)
    assert summary["mean_labels_held"] == pytest.approx(2.0)
    line = summary_line(summary)
    assert "3 clients" in line and f"{summary['mean_tv_to_global']:.3f}" in line


def test_empty_client_has_no_label_distribution_and_is_left_out_of_means():
    part = Partition((np.arange(10), np.array([], dtype=np.int64)), 10, "one-empty")
    rows = partition_table(part, labels=LABELS)
    assert rows[1] == {"client": 2, "examples": 0, "share": 0.0, "labels_held": 0, "entropy_bits": None,
                       "tv_to_global": None, "js_to_global": None}
    assert rows[0]["tv_to_global"] == pytest.approx(0.0, abs=1e-12)
    assert partition_summary(part, labels=LABELS)["mean_tv_to_global"] == pytest.approx(0.0, abs=1e-12)


def test_iid_on_many_examples_is_close_to_global_and_label_skew_is_not():
    labels = np.random.default_rng(0).integers(0, 4, 20_000)
    iid = partition_summary(iid_partition(len(labels), num_clients=5, seed=1), labels=labels, num_labels=4)
    skew = partition_summary(dirichlet_label_skew(labels, num_clients=5, alpha=0.1, seed=1), labels=labels,
                             num_labels=4)
    assert iid["mean_tv_to_global"] < 0.03 and iid["mean_entropy_bits"] > 1.99 and iid["size_cv"] < 1e-3
    assert skew["mean_tv_to_global"] > 0.3 and skew["mean_entropy_bits"] < iid["mean_entropy_bits"] - 0.5


def test_bad_labels_are_rejected():
    with pytest.raises(ValueError):
        partition_table(TINY, labels=LABELS[:-1])
    with pytest.raises(ValueError):
        partition_table(TINY, labels=LABELS, num_labels=2)
    with pytest.raises(ValueError):
        partition_table(TINY, labels=LABELS.astype(float))


def test_tables_are_written_and_read_back(tmp_path):
    part = natural_partition(["a", "a", "b|x", "c", "c", "c", "a", "b|x", "c", "a"])
    rows = partition_table(part, labels=LABELS)
    assert [r["key"] for r in rows] == list(part.keys)
    csv_path, md_path = write_partition_table(rows, path_csv=tmp_path / "t" / "p.csv", path_md=tmp_path / "p.md")
    with csv_path.open(newline="") as f:
        back = list(csv.DictReader(f))
    assert [int(r["examples"]) for r in back] == [r["examples"] for r in rows]
    assert [float(r["tv_to_global"]) for r in back] == [r["tv_to_global"] for r in rows]  # full precision
    assert list(back[0]) == ["client", "key", "examples", "share", "labels_held", "entropy_bits", "tv_to_global",
                             "js_to_global"]
    md = md_path.read_text().splitlines()
    assert md[0].startswith("| client | key | examples |") and set(md[1]) <= set("|-: ")
    assert len(md) == 2 + len(rows) and md[1].count("|") == md[0].count("|") == 9
    assert all(line.count(" | ") == md[0].count(" | ") for line in md[2:])
    assert "b\\|x" in md_path.read_text()  # a '|' in a key does not split the Markdown cell


def test_plot_is_a_png(tmp_path):
    labels = np.random.default_rng(0).integers(0, 3, 300)
    partitions = {"iid": iid_partition(300, num_clients=6, seed=0),
                  "alpha=0.1": dirichlet_label_skew(labels, num_clients=8, alpha=0.1, seed=0)}
    out = plot_partitions(partitions, labels=labels, num_labels=3, label_names=["neg", "neu", "pos"],
                          path=tmp_path / "figs" / "partitions.png")
    assert out == tmp_path / "figs" / "partitions.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000
    sizes_only = plot_partitions({"iid": partitions["iid"]}, labels=None, num_labels=None, label_names=None,
                                 path=tmp_path / "sizes.png")
    assert sizes_only.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        plot_partitions(partitions, labels=labels, num_labels=3, label_names=["one"], path=tmp_path / "x.png")
