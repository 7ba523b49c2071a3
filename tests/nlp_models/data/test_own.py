"""Own classification data: every format, label mapping, each early DataError with its message, caps, argparse."""
import argparse
import json
import re

import pytest

from nlp_models.data.dataset import DEFAULT_RATIOS, largest_remainder, train_validation_test
from nlp_models.data.own import (
    MIN_PER_LABEL,
    DataError,
    add_data_arguments,
    dataset_from_args,
    load_classification,
)
from nlp_models.data.partition import client_splits, iid_partition

# 4 examples per label: the minimum MIN_PER_LABEL allows
ROWS = [("good film", "pos"), ("bad film", "neg"), ("great", "pos"), ("awful", "neg"),
        ("fine, really", "pos"), ("dull", "neg"), ("superb", "pos"), ("poor", "neg")]


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return path


def csv_text(rows, header="text,label"):
    return header + "\n" + "".join(f'"{text}",{label}\n' for text, label in rows)


def jsonl_text(rows, text_key="text", label_key="label"):
    return "\n".join(json.dumps({text_key: text, label_key: label}) for text, label in rows) + "\n"


def refused(path, message, **options):
    """The DataError raised for `path`, checked to name the path and contain `message` verbatim."""
    with pytest.raises(DataError, match=re.escape(message)) as caught:
        load_classification(path, **options)
    assert str(path) in str(caught.value)
    return str(caught.value)


# ---------------------------------------------------------------- formats and labels

def test_csv_string_labels_get_ids_in_sorted_order(tmp_path):
    data = load_classification(write(tmp_path, "reviews.csv", csv_text(ROWS)))
    assert data.name == "reviews" and data.task == "sequence"
    assert data.label_names == ("neg", "pos")
    assert data.texts[:2] == ("good film", "bad film") and data.labels[:2] == (1, 0)
    assert data.texts[4] == "fine, really"  # a quoted comma stays inside the text
    assert data.label_counts() == {"neg": 4, "pos": 4}


def test_tsv_with_named_columns_and_integer_labels_keep_numeric_order(tmp_path):
    # 5 and 10 as strings would sort "10" < "5"; as integers 5 comes first
    rows = "".join(f"{text}\t{5 if label == 'pos' else 10}\tx\n" for text, label in ROWS)
    data = load_classification(write(tmp_path, "d.tsv", "review\tstars\textra\n" + rows),
                               text_col="review", label_col="stars")
    assert data.label_names == ("5", "10")
    assert data.labels[:2] == (0, 1)


def test_csv_bom_and_spaced_header_names_are_tolerated(tmp_path):
    data = load_classification(write(tmp_path, "excel.csv", "\ufefftext, label\n" + csv_text(ROWS).split("\n", 1)[1]))
    assert len(data) == 8


def test_jsonl_integer_labels_already_contiguous_keep_their_ids(tmp_path):
    rows = [(text, int(label == "pos")) for text, label in ROWS]
    data = load_classification(write(tmp_path, "d.jsonl", jsonl_text(rows)))
    assert data.label_names == ("0", "1")
    assert data.labels == tuple(label for _, label in rows)


def test_integer_labels_with_gaps_are_renumbered_and_named(tmp_path):
    rows = [(text, {"pos": 7, "neg": -2}[label]) for text, label in ROWS] + [(f"x{i}", 3) for i in range(4)]
    data = load_classification(write(tmp_path, "d.jsonl", jsonl_text(rows)))
    assert data.label_names == ("-2", "3", "7")
    assert data.label_counts() == {"-2": 4, "3": 4, "7": 4}
    assert data.labels[0] == 2 and data.labels[1] == 0


def test_json_array_file_and_boolean_and_whole_float_labels(tmp_path):
    items = [{"text": text, "label": label == "pos"} for text, label in ROWS]
    data = load_classification(write(tmp_path, "d.json", json.dumps(items, indent=2)))
    assert data.label_names == ("false", "true")
    floats = [{"text": text, "label": float(label == "pos")} for text, label in ROWS]
    assert load_classification(write(tmp_path, "f.json", json.dumps(floats))).label_names == ("0", "1")


def test_save_to_disk_dataset_and_dataset_dict_train_split(tmp_path):
    import datasets

    columns = {"text": [text for text, _ in ROWS], "label": [label for _, label in ROWS]}
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "plain"))
    plain = load_classification(tmp_path / "plain")
    assert plain.name == "plain" and plain.label_names == ("neg", "pos") and len(plain) == 8

    other = {"text": ["only", "in", "test", "split"], "label": ["a", "b", "a", "b"]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns),
                          "test": datasets.Dataset.from_dict(other)}).save_to_disk(str(tmp_path / "dd"))
    train = load_classification(tmp_path / "dd")
    assert train.texts == plain.texts  # the 'train' split only, the test split is not mixed in
    refused(tmp_path / "dd" / "test", "labels with fewer than 4 examples: {'a': 2, 'b': 2}")


def test_save_to_disk_class_label_keeps_its_names_and_refuses_unlabelled_rows(tmp_path):
    import datasets

    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "neutral", "positive"])})
    ids = [2 if label == "pos" else 0 for _, label in ROWS]
    datasets.Dataset.from_dict({"text": [t for t, _ in ROWS], "label": ids}, features=features).save_to_disk(
        str(tmp_path / "cl"))
    data = load_classification(tmp_path / "cl")
    assert data.label_names == ("negative", "positive")  # 'neutral' is unused: ids renumbered 0..1
    assert data.labels[:2] == (1, 0)

    unlabelled = [-1] + ids[1:]
    datasets.Dataset.from_dict({"text": [t for t, _ in ROWS], "label": unlabelled}, features=features).save_to_disk(
        str(tmp_path / "unl"))
    refused(tmp_path / "unl", "row 0: empty or missing label in column 'label'")


# ---------------------------------------------------------------- early errors

def test_missing_path(tmp_path):
    refused(tmp_path / "nope.csv", "no such file or folder")


def test_unknown_extension(tmp_path):
    message = refused(write(tmp_path, "d.parquet", "x"), "unknown format '.parquet'")
    assert ".csv, .tsv, .jsonl" in message


@pytest.mark.parametrize("name,content", [("d.csv", ""), ("d.csv", "\n\n"), ("d.jsonl", ""), ("d.json", "  \n")])
def test_empty_file(tmp_path, name, content):
    refused(write(tmp_path, name, content), "the file is empty")


def test_header_without_rows(tmp_path):
    refused(write(tmp_path, "d.csv", "text,label\n\n"), "no rows below the header")


def test_missing_column_lists_the_columns(tmp_path):
    refused(write(tmp_path, "d.csv", "body,label\na,b\n"), "no column 'text'; the columns are ['body', 'label']")
    refused(write(tmp_path, "d.jsonl", jsonl_text(ROWS, label_key="y")),
            "no column 'label'; the columns are ['text', 'y']")


def test_missing_column_in_a_saved_dataset(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"sentence": ["a"], "label": [0]}).save_to_disk(str(tmp_path / "ds"))
    refused(tmp_path / "ds", "no column 'text'; the columns are ['sentence', 'label']")


def test_empty_text_names_the_line_and_no_row_is_skipped(tmp_path):
    content = csv_text(ROWS[:3] + [("  ", "pos")] + ROWS[3:] + [("", "neg")])
    message = refused(write(tmp_path, "d.csv", content), "2 bad rows: line 5: empty or missing text in column 'text'")
    assert "line 11: empty or missing text" in message


def test_missing_text_key_and_non_string_text_in_jsonl(tmp_path):
    lines = jsonl_text(ROWS) + json.dumps({"label": "pos"}) + "\n" + json.dumps({"text": 5, "label": "neg"}) + "\n"
    message = refused(write(tmp_path, "d.jsonl", lines), "line 9: empty or missing text in column 'text'")
    assert "line 10: the text in column 'text' is not a string (int)" in message


def test_empty_label_and_fractional_label(tmp_path):
    refused(write(tmp_path, "d.csv", csv_text(ROWS) + "orphan,\n"), "line 10: empty or missing label in column 'label'")
    lines = jsonl_text(ROWS) + json.dumps({"text": "half", "label": 0.5}) + "\n"
    refused(write(tmp_path, "d.jsonl", lines), "line 9: label 0.5 is not a whole number (column 'label')")


def test_many_bad_rows_are_counted_and_the_first_few_named(tmp_path):
    content = csv_text(ROWS) + ",pos\n" * 12
    message = refused(write(tmp_path, "d.csv", content), "12 bad rows: line 10: empty or missing text")
    assert "(and 7 more)" in message and "line 15" not in message


def test_ragged_csv_row(tmp_path):
    content = csv_text(ROWS[:2]) + "unquoted, comma,pos\n" + csv_text(ROWS[2:]).split("\n", 1)[1]
    refused(write(tmp_path, "d.csv", content), "line 4: 3 fields but the header has 2; quote fields that contain ','")


def test_ragged_row_line_number_counts_multiline_quoted_fields(tmp_path):
    content = 'text,label\n"two\nlines",pos\nshort\n'
    refused(write(tmp_path, "d.csv", content), "line 4: 1 fields but the header has 2")


def test_malformed_json_line(tmp_path):
    content = jsonl_text(ROWS[:2]) + "{oops\n" + jsonl_text(ROWS[2:])
    refused(write(tmp_path, "d.jsonl", content), "line 3: not valid JSON (Expecting property name")


def test_pretty_printed_json_object_gets_the_json_lines_hint_once(tmp_path):
    message = refused(write(tmp_path, "d.json", json.dumps({"text": "a", "label": 1}, indent=2)),
                      "4 bad rows: line 1: not valid JSON")
    assert message.count("JSON Lines") == 1


def test_json_line_that_is_not_an_object(tmp_path):
    refused(write(tmp_path, "d.jsonl", jsonl_text(ROWS) + "[1, 2]\n"), "line 9: not a JSON object (list)")


def test_not_utf8(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes(b"text,label\ncaf\xe9,pos\n")
    refused(path, "not UTF-8 text")


def test_folder_that_is_not_a_saved_dataset(tmp_path):
    (tmp_path / "folder").mkdir()
    refused(tmp_path / "folder", "not a folder written by datasets' save_to_disk")


def test_dataset_dict_without_train_split_points_at_a_split_folder(tmp_path):
    import datasets

    columns = {"text": [text for text, _ in ROWS], "label": [label for _, label in ROWS]}
    datasets.DatasetDict({"validation": datasets.Dataset.from_dict(columns)}).save_to_disk(str(tmp_path / "dd"))
    message = refused(tmp_path / "dd", "a DatasetDict without a 'train' split (splits: ['validation'])")
    assert str(tmp_path / "dd" / "validation") in message
    assert len(load_classification(tmp_path / "dd" / "validation")) == 8  # the advice works


def test_only_one_label(tmp_path):
    refused(write(tmp_path, "d.csv", csv_text([(f"t{i}", "pos") for i in range(6)])),
            "only one label ('pos') in column 'label'; classification needs at least two")


def test_min_per_label_matches_how_splits_are_made():
    """Below MIN_PER_LABEL examples a label gets no test example in a 6:2:2 largest-remainder split."""
    assert 0 in largest_remainder(MIN_PER_LABEL - 1, DEFAULT_RATIOS)
    assert all(largest_remainder(n, DEFAULT_RATIOS).min() > 0 for n in range(MIN_PER_LABEL, 200))


def test_rare_label_is_an_error_unless_accepted(tmp_path):
    path = write(tmp_path, "d.csv", csv_text(ROWS + [("typo row", "postive")] * 3))
    message = refused(path, "labels with fewer than 4 examples: {'postive': 3}")
    assert "min_per_label=1" in message
    data = load_classification(path, min_per_label=1)
    assert data.label_counts()["postive"] == 3
    # the reason: with 3 examples the label never reaches the test split
    splits = train_validation_test(data)
    assert data.label_names.index("postive") not in splits.test.labels
    partition = iid_partition(len(data), num_clients=1)
    (client,) = client_splits(partition, labels=data.label_array())
    assert data.label_names.index("postive") not in data.label_array()[client.test]


# ---------------------------------------------------------------- max_examples

def test_max_examples_is_stratified_and_deterministic_by_seed(tmp_path):
    path = write(tmp_path, "d.csv", csv_text([(f"t{i}", "a" if i % 4 else "b") for i in range(80)]))
    first = load_classification(path, max_examples=20, seed=3)
    assert first.texts == load_classification(path, max_examples=20, seed=3).texts
    assert first.label_counts() == {"a": 15, "b": 5}  # the 3:1 share is kept
    other = load_classification(path, max_examples=20, seed=4)
    assert other.texts != first.texts and other.label_counts() == first.label_counts()
    assert len(load_classification(path, max_examples=500)) == 80


def test_max_examples_that_starves_a_label_is_refused(tmp_path):
    path = write(tmp_path, "d.csv", csv_text([(f"t{i}", "a" if i % 10 else "b") for i in range(100)]))
    refused(path, "with max_examples=20, labels with fewer than 4 examples: {'b': 2}", max_examples=20)
    refused(path, "max_examples must be a positive integer, got 0", max_examples=0)


# ---------------------------------------------------------------- argparse helpers

def parser():
    made = argparse.ArgumentParser(prog="example")
    add_data_arguments(made)
    return made


def test_dataset_from_args(tmp_path):
    path = write(tmp_path, "d.csv", csv_text(ROWS, header="t,y"))
    assert dataset_from_args(parser().parse_args([])) is None
    data = dataset_from_args(parser().parse_args(["--data", str(path), "--text-col", "t", "--label-col", "y"]))
    assert data.label_names == ("neg", "pos") and len(data) == 8
    bigger = write(tmp_path, "big.csv", csv_text([(f"t{i}", "ab"[i % 2]) for i in range(40)]))
    capped = dataset_from_args(parser().parse_args(["--data", str(bigger)]), max_examples=20, seed=1)
    assert capped == load_classification(bigger, max_examples=20, seed=1) and len(capped) == 20


def test_dataset_from_args_errors_go_through_parser_error(tmp_path, capsys):
    made = parser()
    args = made.parse_args(["--data", str(write(tmp_path, "d.csv", csv_text(ROWS)))])
    args.text_col = "body"
    with pytest.raises(SystemExit) as exited:
        try:
            dataset_from_args(args)
        except DataError as error:
            made.error(str(error))
    assert exited.value.code == 2
    assert "example: error:" in (err := capsys.readouterr().err) and "no column 'body'" in err
    with pytest.raises(DataError, match=re.escape("--label-col only apply with --data PATH")):
        dataset_from_args(made.parse_args(["--label-col", "y"]))
