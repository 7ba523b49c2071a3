import argparse
import json

import pytest

from nlp_models.data.own import DataError, add_data_arguments, dataset_from_args, load_classification


def _csv(tmp_path, text, name="d.csv"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


ROWS = [("good film", "pos"), ("bad film", "neg"), ("great", "pos"), ("awful", "neg"), ("fine", "pos"),
        ("dull", "neg"), ("superb", "pos"), ("poor", "neg")]


def test_csv_with_string_labels_maps_them_in_sorted_order(tmp_path):
    p = _csv(tmp_path, "text,label\n" + "".join(f'"{t}",{y}\n' for t, y in ROWS))
    ds = load_classification(p)
    assert ds.label_names == ("neg", "pos") and ds.texts[0] == "good film" and ds.labels[:2] == (1, 0)
    assert ds.label_counts() == {"neg": 4, "pos": 4}


def test_tsv_jsonl_and_integer_labels(tmp_path):
    tsv = _csv(tmp_path, "review\tstars\n" + "".join(f"{t}\t{5 if y == 'pos' else 1}\n" for t, y in ROWS), "d.tsv")
    ds = load_classification(tsv, text_col="review", label_col="stars")
    assert ds.label_names == ("1", "5") and ds.labels[0] == 1
    jl = tmp_path / "d.jsonl"
    jl.write_text("\n".join(json.dumps({"text": t, "label": int(y == "pos")}) for t, y in ROWS))
    ds = load_classification(jl)
    assert ds.label_names == ("0", "1") and len(ds) == 8


def test_save_to_disk_folder(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": [t for t, _ in ROWS], "label": [y for _, y in ROWS]}).save_to_disk(str(tmp_path / "ds"))
    assert len(load_classification(tmp_path / "ds")) == 8
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": [t for t, _ in ROWS], "label": [y for _, y in ROWS]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert load_classification(tmp_path / "dd").label_names == ("neg", "pos")


@pytest.mark.parametrize("content,name,message", [
    (None, "missing.csv", "no such file"),
    ("x", "d.parquet", "unknown format"),
    ("", "d.csv", "empty"),
    ("text,label\n", "d.csv", "no rows"),
    ("body,label\na,b\n", "d.csv", "no column 'text'; the columns are ['body', 'label']"),
    ("text,label\n,pos\n", "d.csv", "row 1 has an empty or missing 'text'"),
    ("text,label\na,pos\nb\n", "d.csv", "row 3 has 1 fields"),
    ("text,label\na,pos\nb,pos\nc,pos\n", "d.csv", "only one class"),
    ("text,label\na,pos\nb,pos\nc,pos\nd,neg\n", "d.csv", "fewer than 3"),
    ('{"text": "a", "label": 1}\n{oops\n', "d.jsonl", "line 2 is not valid JSON"),
])
def test_bad_data_is_refused_early_with_a_clear_message(tmp_path, content, name, message):
    p = tmp_path / name
    if content is not None:
        p.write_text(content)
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        load_classification(p)


def test_max_examples_is_stratified_and_deterministic(tmp_path):
    p = _csv(tmp_path, "text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(40)))
    a, b = load_classification(p, max_examples=10, seed=3), load_classification(p, max_examples=10, seed=3)
    assert a.texts == b.texts and len(a) == 10 and a.label_counts() == {"a": 5, "b": 5}


def test_argparse_helpers(tmp_path):
    parser = argparse.ArgumentParser()
    add_data_arguments(parser)
    assert dataset_from_args(parser.parse_args([])) is None
    p = _csv(tmp_path, "t,y\n" + "".join(f'"{t}",{y}\n' for t, y in ROWS))
    ds = dataset_from_args(parser.parse_args(["--data", str(p), "--text-col", "t", "--label-col", "y"]))
    assert len(ds) == 8
