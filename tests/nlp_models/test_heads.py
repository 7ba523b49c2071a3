"""Heads and TextClassifier: mask-aware pooling, Opacus-safe ids, head selection."""
import pytest
import torch

from nlp_models.adapters import attach_adapters, count_trainable, set_size
from nlp_models.backbone import tiny_bert
from nlp_models.heads import (
    SequenceClassifier,
    TextClassifier,
    TokenClassifier,
    batch_position_ids,
    batch_token_type_ids,
    mean_pool,
)


def test_mean_pool_ignores_padding():
    states = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(mean_pool(states, mask), torch.tensor([[2.0, 3.0]]))


def test_ids_are_batch_sized_and_contiguous():
    ids = torch.zeros(4, 6, dtype=torch.long)
    positions, types = batch_position_ids(ids), batch_token_type_ids(ids)
    assert positions.shape == types.shape == (4, 6)
    assert positions.is_contiguous() and types.is_contiguous()
    assert torch.equal(positions[3], torch.arange(6)) and not types.any()


@pytest.fixture
def classifier():
    backbone = attach_adapters(tiny_bert(seed=0), {"global": 4}, seed=0)
    return TextClassifier(backbone, {"g1": SequenceClassifier(32, 3), "ner": TokenClassifier(32, 5)})


def test_forward_shapes_and_head_choice(classifier):
    ids = torch.randint(1000, 2000, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    sequence = classifier(ids, mask, head="g1")
    token = classifier(ids, mask, head="ner")
    assert sequence.logits.shape == (2, 3) and sequence.pooled.shape == (2, 32)
    assert token.logits.shape == (2, 5, 5)
    torch.testing.assert_close(sequence.pooled, token.pooled)
    with pytest.raises(ValueError, match="choose a head"):
        classifier(ids, mask)
    with pytest.raises(KeyError, match="no head 'g2'"):
        classifier(ids, mask, head="g2")


def test_padding_does_not_change_the_pooled_representation(classifier):
    classifier.eval()
    ids = torch.randint(1000, 2000, (1, 4))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    short = classifier(ids, torch.ones_like(ids), head="g1").pooled
    long = classifier(padded, torch.tensor([[1, 1, 1, 1, 0, 0, 0]]), head="g1").pooled
    torch.testing.assert_close(short, long, atol=1e-5, rtol=1e-5)


def test_freeze_backbone_keeps_heads_and_adapters_trainable(classifier):
    classifier.freeze_backbone()
    heads = sum(p.numel() for p in classifier.heads.parameters())
    assert count_trainable(classifier) == set_size(classifier, "global") + heads
    assert classifier.adapters.names == ("global",)
    with classifier.adapters.active({}):
        assert classifier.adapters.mixing == {}
    assert classifier.adapters.mixing == {"global": 1.0}


def test_classification_metrics_pool_accuracy_and_loss_over_batches():
    from nlp_models.heads import classification_metrics

    logits = [torch.tensor([[2.0, 0.0], [0.0, 2.0]]), torch.tensor([[1.0, 0.0]])]
    labels = [torch.tensor([0, 0]), torch.tensor([0])]
    out = classification_metrics(zip(logits, labels))
    expected_loss = float(sum(torch.nn.functional.cross_entropy(x, y, reduction="sum") for x, y in zip(logits, labels)))
    assert out == pytest.approx({"accuracy": 2 / 3, "loss": expected_loss / 3, "examples": 3.0})
    assert classification_metrics([]) == {"accuracy": 0.0, "loss": 0.0, "examples": 0.0}
