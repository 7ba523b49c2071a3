"""Your own classification data: a CSV/TSV file, a JSON Lines file, or a ``datasets`` ``save_to_disk`` folder.

    load_classification("reviews.csv", text_col="review", label_col="stars")

Formats (chosen by the path, not sniffed):

- ``.csv`` (comma) and ``.tsv`` (tab): the first row is the header; UTF-8, a leading BOM (Excel) is ignored,
  header names are stripped of spaces. Quoting is the ``csv`` module's default (what pandas and Excel
  write), so a field that starts with ``"`` is read as a quoted field. Blank lines, and rows whose every
  field is empty, are ignored.
- ``.jsonl`` / ``.json``: one JSON object per line (blank lines ignored); a ``.json`` file whose first
  character is ``[`` is read as one JSON array of objects instead.
- a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``. For a DatasetDict only
  the ``'train'`` split is read: this toolkit makes its own train/validation/test splits, and the other
  splits of published sets are often unlabelled (label -1). To read another split, pass its subfolder
  (``folder/validation``): ``DatasetDict.save_to_disk`` writes every split as a Dataset folder.

Labels: string labels get ids in sorted order of the strings (``"neg" < "pos"``). Integer labels (ints,
whole-number floats, strings such as ``"5"`` or ``"-1"``) keep their numeric order and are renumbered
0..K-1 only when the values are not already 0..K-1; ``label_names`` records the original values
(``("1", "5")``). A ``ClassLabel`` column of a saved dataset keeps its own names. Booleans become
``"false"``/``"true"``. Texts are stripped of surrounding white space.

Every problem is raised early, before any model work, as a ``DataError`` naming the file and the
problem: a missing path, an unknown extension, an empty file or no rows, a missing column (the columns
that exist are listed), a ragged CSV row, a malformed JSON line, an empty or missing text or label (a row
is never skipped: all bad rows are counted and the first few are named, by file line for CSV/JSONL and
by 0-based index for JSON arrays and saved datasets), a single label, and a label with fewer than
``MIN_PER_LABEL`` examples.

Why 4 per label: ``train_validation_test`` and ``partition.client_splits`` split each label's examples
6:2:2 by largest remainders, which gives 1 example -> (1, 0, 0), 2 -> (1, 1, 0), 3 -> (2, 1, 0),
4 -> (2, 1, 1). Below 4 a label can never be in a test split, even before the examples are spread over
clients; such a label is usually a typo, and when it is not, metrics over it are meaningless. It is an
error (not a warning) so it is seen; pass ``min_per_label=1`` to accept rare labels anyway.

``max_examples`` keeps a stratified, seed-determined subset (``nlp_models.data.dataset.cap``: each label
keeps its share by largest remainders; the same seed gives the same subset), and the ``min_per_label``
check is repeated on the subset.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from nlp_models.data.dataset import TextDataset, cap

MIN_PER_LABEL = 4
CSV_DELIMITERS = {".csv": ",", ".tsv": "\t"}
JSON_SUFFIXES = (".jsonl", ".json")
SHOWN_PROBLEMS = 5
_INTEGER = re.compile(r"[+-]?[0-9]+")


class DataError(ValueError):
    """The data cannot be used for classification; the message names the file and what is wrong."""


class _Rows:
    """What a reader found: the column names, and per row its location and its text and label cells."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.where: list[str] = []
        self.texts: list[Any] = []
        self.labels: list[Any] = []
        self.class_names: list[str] | None = None  # a saved dataset's ClassLabel names


def _fail(path: Path, problems: Sequence[tuple[str, str]], hint: str = "") -> None:
    """Raise one DataError for every bad row, naming the first few (and a hint on the fix, once)."""
    if not problems:
        return
    shown = "; ".join(f"{where}: {what}" for where, what in problems[:SHOWN_PROBLEMS])
    more = f" (and {len(problems) - SHOWN_PROBLEMS} more)" if len(problems) > SHOWN_PROBLEMS else ""
    count = f"{len(problems)} bad rows: " if len(problems) > 1 else ""
    raise DataError(f"{path}: {count}{shown}{more}{'; ' + hint if hint else ''}")


def _check_columns(path: Path, columns: Sequence[str], wanted: Iterable[str]) -> None:
    for column in wanted:
        if column not in columns:
            raise DataError(f"{path}: no column {column!r}; the columns are {list(columns)}")
        if list(columns).count(column) > 1:
            raise DataError(f"{path}: the header names column {column!r} more than once")


def _read_csv(path: Path, delimiter: str, text_col: str, label_col: str) -> _Rows:
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle, delimiter=delimiter)
        records = _records(path, reader)
        header = next(records, None)
        if header is None:
            raise DataError(f"{path}: the file is empty")
        columns = [name.strip() for name in header[1]]
        _check_columns(path, columns, (text_col, label_col))
        text_at, label_at = columns.index(text_col), columns.index(label_col)
        rows, ragged = _Rows(columns), []
        for line, record in records:
            if len(record) != len(columns):
                ragged.append((f"line {line}", f"{len(record)} fields but the header has {len(columns)}"))
                continue
            rows.where.append(f"line {line}")
            rows.texts.append(record[text_at])
            rows.labels.append(record[label_at])
    _fail(path, ragged, hint=f"quote fields that contain {delimiter!r}, quotes or line breaks")
    if not rows.texts:
        raise DataError(f"{path}: no rows below the header")
    return rows


def _records(path: Path, reader: Any) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) per non-blank CSV record; csv and encoding errors become DataErrors."""
    start = 1
    try:
        for record in reader:
            if any(field.strip() for field in record):
                yield start, record
            start = reader.line_num + 1
    except csv.Error as error:
        raise DataError(f"{path}: line {reader.line_num}: {error}") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text; save the file as UTF-8") from None


def _read_json(path: Path, text_col: str, label_col: str) -> _Rows:
    try:
        content = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text; save the file as UTF-8") from None
    if not content.strip():
        raise DataError(f"{path}: the file is empty")
    problems: list[tuple[str, str]] = []
    objects: list[tuple[str, Any]] = []
    if path.suffix.lower() == ".json" and content.lstrip().startswith("["):
        try:
            items = json.loads(content)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}: not valid JSON ({error.msg} at line {error.lineno} "
                            f"column {error.colno})") from None
        objects = [(f"item {index}", item) for index, item in enumerate(items)]
    else:
        for number, line in enumerate(content.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                objects.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as error:
                problems.append((f"line {number}", f"not valid JSON ({error.msg} at column {error.colno})"))
    _fail(path, problems, hint="each line must hold one whole JSON object (JSON Lines); a .json file may "
                               "instead hold one JSON array of objects")
    columns: dict[str, None] = {}
    for where, item in objects:
        if isinstance(item, dict):
            columns.update(dict.fromkeys(item))
        else:
            problems.append((where, f"not a JSON object ({type(item).__name__})"))
    _fail(path, problems)
    if not objects:
        raise DataError(f"{path}: no rows")
    _check_columns(path, list(columns), (text_col, label_col))
    rows = _Rows(list(columns))
    for where, item in objects:
        rows.where.append(where)
        rows.texts.append(item.get(text_col))
        rows.labels.append(item.get(label_col))
    return rows


def _read_saved(path: Path, text_col: str, label_col: str) -> _Rows:
    """A saved Dataset, or the 'train' split of a saved DatasetDict."""
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except Exception as error:  # noqa: BLE001 - any failure here means "not a readable save_to_disk folder"
        raise DataError(f"{path}: not a folder written by datasets' save_to_disk ({error})") from None
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise DataError(f"{path}: a DatasetDict without a 'train' split (splits: {sorted(data)}); "
                            f"pass one split's folder instead, e.g. {path / sorted(data)[0]}")
        data = data["train"]
    if len(data) == 0:
        raise DataError(f"{path}: no rows")
    _check_columns(path, data.column_names, (text_col, label_col))
    rows = _Rows(data.column_names)
    rows.where = [f"row {index}" for index in range(len(data))]
    rows.texts = list(data[text_col])
    rows.labels = list(data[label_col])
    feature = data.features[label_col]
    if isinstance(feature, datasets.ClassLabel):
        rows.class_names = list(feature.names)
        rows.labels = [None if label is None or label < 0 else label for label in rows.labels]  # -1: no label
    return rows


def _label(value: Any) -> int | str | None:
    """An int for integer-like labels, a stripped str otherwise, None when missing; TypeError if unusable."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
        raise TypeError(f"label {value!r} is not a whole number")
    if isinstance(value, str):
        return value.strip() or None
    raise TypeError(f"label {value!r} is not a string or an integer ({type(value).__name__})")


def _check_rows(path: Path, rows: _Rows, text_col: str, label_col: str) -> tuple[list[str], list[int | str]]:
    texts: list[str] = []
    labels: list[int | str] = []
    problems: list[tuple[str, str]] = []
    for where, text, raw in zip(rows.where, rows.texts, rows.labels):
        if text is None or (isinstance(text, str) and not text.strip()):
            problems.append((where, f"empty or missing text in column {text_col!r}"))
        elif not isinstance(text, str):
            problems.append((where, f"the text in column {text_col!r} is not a string ({type(text).__name__})"))
        try:
            label = _label(raw)
        except TypeError as error:
            problems.append((where, f"{error} (column {label_col!r})"))
            continue
        if label is None:
            problems.append((where, f"empty or missing label in column {label_col!r}"))
        elif isinstance(text, str) and text.strip():
            texts.append(text.strip())
            labels.append(label)
    _fail(path, problems)
    return texts, labels


def _label_ids(values: list[int | str], class_names: list[str] | None) -> tuple[list[int], tuple[str, ...]]:
    """Contiguous ids and names: integers in numeric order, strings in sorted order."""
    if all(isinstance(v, int) or _INTEGER.fullmatch(v) for v in values):
        numbers = [int(v) for v in values]
        used = sorted(set(numbers))
        names = [class_names[n] if class_names and n < len(class_names) else str(n) for n in used]
    else:
        numbers = [str(v) for v in values]
        used = names = sorted(set(numbers))
    index = {value: position for position, value in enumerate(used)}
    return [index[v] for v in numbers], tuple(names)


def _check_counts(path: Path, dataset: TextDataset, min_per_label: int, label_col: str, after: str = "") -> None:
    counts = dataset.label_counts()
    if sum(1 for n in counts.values() if n) < 2:
        raise DataError(f"{path}: {after}only one label ({next(k for k, n in counts.items() if n)!r}) in column "
                        f"{label_col!r}; classification needs at least two")
    rare = {name: n for name, n in counts.items() if n < min_per_label}
    if rare:
        raise DataError(f"{path}: {after}labels with fewer than {min_per_label} examples: {rare}; a label needs "
                        f"{min_per_label} to appear in every 6:2:2 train/validation/test split (drop or merge "
                        "those rows, or pass min_per_label=1 to accept them)")


def load_classification(
    path: str | Path,
    *,
    text_col: str = "text",
    label_col: str = "label",
    max_examples: int | None = None,
    seed: int = 0,
    min_per_label: int = MIN_PER_LABEL,
) -> TextDataset:
    """A sequence-classification ``TextDataset`` from your own file or folder, checked (see the module doc)."""
    path = Path(path)
    if max_examples is not None and (isinstance(max_examples, bool) or max_examples < 1):
        raise DataError(f"{path}: max_examples must be a positive integer, got {max_examples!r}")
    if min_per_label < 1:
        raise DataError(f"{path}: min_per_label must be >= 1, got {min_per_label}")
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    suffix = path.suffix.lower()
    if path.is_dir():
        rows = _read_saved(path, text_col, label_col)
    elif suffix in CSV_DELIMITERS:
        rows = _read_csv(path, CSV_DELIMITERS[suffix], text_col, label_col)
    elif suffix in JSON_SUFFIXES:
        rows = _read_json(path, text_col, label_col)
    else:
        raise DataError(f"{path}: unknown format {suffix or '(no extension)'!r}; use .csv, .tsv, .jsonl, .json "
                        "or a folder written by datasets' save_to_disk")
    texts, values = _check_rows(path, rows, text_col, label_col)
    labels, names = _label_ids(values, rows.class_names)
    dataset = TextDataset(name=path.stem if path.is_file() else path.name, texts=tuple(texts),
                          labels=tuple(labels), label_names=names)
    _check_counts(path, dataset, min_per_label, label_col)
    if max_examples is not None:
        dataset = cap(dataset, max_examples, seed=seed)
        _check_counts(path, dataset, min_per_label, label_col, after=f"with max_examples={max_examples}, ")
    return dataset


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--data PATH``, ``--text-col`` and ``--label-col`` so an example can train on your data."""
    group = parser.add_argument_group("your own data",
                                      "classify the texts of your own file instead of the built-in corpus")
    group.add_argument("--data", metavar="PATH",
                       help="a .csv, .tsv, .jsonl or .json file, or a datasets save_to_disk folder")
    group.add_argument("--text-col", metavar="NAME", help="column holding the texts (default: text)")
    group.add_argument("--label-col", metavar="NAME", help="column holding the labels (default: label)")


def dataset_from_args(
    args: argparse.Namespace, *, max_examples: int | None = None, seed: int = 0
) -> TextDataset | None:
    """The dataset ``--data`` names, or None without ``--data``.

    Raises ``DataError`` (a one-line message) for the caller to pass to ``parser.error``; a column option
    without ``--data`` is an error too, since it would otherwise be ignored silently.
    """
    text_col, label_col = getattr(args, "text_col", None), getattr(args, "label_col", None)
    if getattr(args, "data", None) is None:
        given = [flag for flag, value in (("--text-col", text_col), ("--label-col", label_col)) if value is not None]
        if given:
            raise DataError(f"{' and '.join(given)} only apply with --data PATH")
        return None
    return load_classification(args.data, text_col=text_col or "text", label_col=label_col or "label",
                               max_examples=max_examples, seed=seed)
