"""Your own classification data: a CSV/TSV, a JSONL file, or a `datasets.save_to_disk` folder.

    load_classification("reviews.csv", text_col="review", label_col="stars")

Labels may be strings or integers. String labels map to ids in sorted order of the strings;
integer labels keep their order and are renumbered 0..K-1 (the names record the original values).
Every problem is reported early, before any model work, as a `DataError` naming the file and the
problem: a missing path, an unknown extension, no rows, a missing column (the existing ones are
listed), an empty text or label (row number given), a malformed JSON line, a ragged CSV row, a
single class. Rows are never skipped silently. A label with fewer than 3 examples is an error too:
each client's data is split 60/20/20 into train/validation/test, stratified by label, which needs
at least one example per split.
`max_examples` keeps a stratified, seed-determined subset (`nlp_models.data.dataset.cap`).
"""
from __future__ import annotations

import argparse
import csv
import json
from collections import Counter
from pathlib import Path

from nlp_models.data.dataset import TextDataset, cap

MIN_PER_LABEL = 3


class DataError(ValueError):
    """The data cannot be used; the message names the file and what is wrong."""


def _rows_csv(path: Path, delimiter: str) -> tuple[list[dict[str, str]], list[str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        header = next(reader, None)
        if not header:
            raise DataError(f"{path}: the file is empty")
        rows = []
        for number, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise DataError(f"{path}: row {number} has {len(row)} fields, the header has {len(header)}")
            rows.append(dict(zip(header, row)))
    return rows, header


def _rows_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    rows, columns = [], []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{path}: line {number} is not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}: line {number} is not a JSON object")
            columns += [k for k in row if k not in columns]
            rows.append(row)
    return rows, columns


def _rows_disk(path: Path) -> tuple[list[dict], list[str]]:
    """A Dataset, or the 'train' split of a DatasetDict (the other splits are left alone)."""
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(f"{path}: not a folder written by datasets' save_to_disk ({exc})") from None
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise DataError(f"{path}: a DatasetDict without a 'train' split (splits: {sorted(data)})")
        data = data["train"]
    return [dict(r) for r in data], list(data.column_names)


def load_classification(path: str | Path, *, text_col: str = "text", label_col: str = "label",
                        max_examples: int | None = None, seed: int = 0) -> TextDataset:
    """A sequence-classification TextDataset from your own file (see the module doc)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    suffix = path.suffix.lower()
    if path.is_dir():
        rows, columns = _rows_disk(path)
    elif suffix == ".csv":
        rows, columns = _rows_csv(path, ",")
    elif suffix == ".tsv":
        rows, columns = _rows_csv(path, "\t")
    elif suffix in (".jsonl", ".json"):
        rows, columns = _rows_jsonl(path)
    else:
        raise DataError(f"{path}: unknown format '{suffix}' (use .csv, .tsv, .jsonl or a save_to_disk folder)")
    if not rows:
        raise DataError(f"{path}: no rows")
    for col in (text_col, label_col):
        if col not in columns:
            raise DataError(f"{path}: no column '{col}'; the columns are {columns}")
    texts, raw = [], []
    for number, row in enumerate(rows, start=1):
        text, label = row.get(text_col), row.get(label_col)
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{path}: row {number} has an empty or missing '{text_col}'")
        if label is None or (isinstance(label, str) and not label.strip()) or isinstance(label, (bool, float, dict, list)):
            raise DataError(f"{path}: row {number} has an empty, missing or non-integer/non-string '{label_col}'")
        texts.append(text)
        raw.append(label.strip() if isinstance(label, str) else int(label))
    as_ints = all(isinstance(v, int) or (isinstance(v, str) and v.lstrip("-").isdigit()) for v in raw)
    values = [int(v) for v in raw] if as_ints else [str(v) for v in raw]
    names = sorted(set(values))
    if len(names) < 2:
        raise DataError(f"{path}: only one class ({names[0]!r}) in '{label_col}'; classification needs two")
    counts = Counter(values)
    rare = {str(k): n for k, n in counts.items() if n < MIN_PER_LABEL}
    if rare:
        raise DataError(f"{path}: labels with fewer than {MIN_PER_LABEL} examples (train/validation/test "
                        f"splits need one each): {rare}")
    index = {v: i for i, v in enumerate(names)}
    dataset = TextDataset(name=path.stem, texts=tuple(texts), labels=tuple(index[v] for v in values),
                          label_names=tuple(str(v) for v in names))
    if max_examples is not None:
        if max_examples < 2:
            raise DataError("max_examples must be at least 2")
        dataset = cap(dataset, max_examples, seed=seed)
    return dataset


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """--data PATH, --text-col, --label-col for an example's command line."""
    group = parser.add_argument_group("own data")
    group.add_argument("--data", metavar="PATH", help="your classification data: .csv, .tsv, .jsonl or a save_to_disk folder")
    group.add_argument("--text-col", default="text", help="column holding the text (default: text)")
    group.add_argument("--label-col", default="label", help="column holding the label (default: label)")


def dataset_from_args(args: argparse.Namespace, *, max_examples: int | None = None, seed: int = 0) -> TextDataset | None:
    """The dataset named by --data (None without it); raises DataError for the caller's parser.error."""
    if getattr(args, "data", None) is None:
        return None
    return load_classification(args.data, text_col=args.text_col, label_col=args.label_col,
                               max_examples=max_examples, seed=seed)
