"""MOON (fl_algorithms.algorithms.moon): the model-contrastive loss, the objective and one client round
with a tiny adapter client (fl_algorithms.training.adapter_trainer, MOON_MODEL)."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch.nn import functional as F

from fl_algorithms.algorithms.moon import (GLOBAL, GLOBAL_SETS, HEAD, LOCAL, LOCAL_SETS, MOON, PART, PREVIOUS,
                                           PREVIOUS_ROUND, PREVIOUS_SETS, model_contrastive_loss, moon_objective)
from fl_algorithms.api import ClientContext
from tests.fl_algorithms.algorithms.toy_adapters import ToyAdapterModel


def test_contrastive_loss_matches_a_hand_computation():
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    z_prev = torch.tensor([[0.0, 1.0], [1.0, -1.0]])
    tau = 0.5
    # row 0: sim(z, z_glob) = 1/sqrt(2), sim(z, z_prev) = 0;  row 1: 1 and 0
    expected = []
    for pos, neg in ((1 / math.sqrt(2), 0.0), (1.0, 0.0)):
        expected.append(-math.log(math.exp(pos / tau) / (math.exp(pos / tau) + math.exp(neg / tau))))
    got = model_contrastive_loss(z, z_glob, z_prev, tau=tau)
    assert got.shape == (2,)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)


vectors = arrays(np.float32, (3, 4), elements=st.floats(-10, 10, width=32))


@given(z=vectors, z_glob=vectors, z_prev=vectors, tau=st.sampled_from([0.1, 0.5, 1.0]))
def test_contrastive_loss_is_non_negative_bounded_and_log_2_when_global_and_previous_coincide(z, z_glob, z_prev, tau):
    z, z_glob, z_prev = (torch.from_numpy(a) for a in (z, z_glob, z_prev))
    loss = model_contrastive_loss(z, z_glob, z_prev, tau=tau)
    assert torch.all(loss >= 0)
    assert torch.all(loss <= math.log1p(math.exp(2 / tau)) + 1e-4)  # cosine similarities differ by at most 2
    tied = model_contrastive_loss(z, z_glob, z_glob.clone(), tau=tau)
    np.testing.assert_allclose(tied.numpy(), math.log(2), rtol=1e-6)


def ToyMOONModel():
    """The six adapter sets of MOON_MODEL and its one head."""
    return ToyAdapterModel(sets=LOCAL_SETS + GLOBAL_SETS + PREVIOUS_SETS, heads=(HEAD,), d=5, hidden=6)


@pytest.mark.parametrize("mu,tau", [(1.0, 0.5), (5.0, 0.1), (0.0, 0.5)])
def test_objective_is_cross_entropy_plus_mu_times_the_contrastive_loss_per_example(mu, tau):
    model = ToyMOONModel()
    g = torch.Generator().manual_seed(1)
    batch = {"x": torch.randn(7, 5, generator=g), "y": torch.randint(0, 3, (7,), generator=g)}
    terms = moon_objective(model, batch, mu=mu, tau=tau)
    assert terms.batch is None and terms.per_example.shape == (7,)  # per example: DP-SGD may clip it
    z = model.represent(batch, mixing=LOCAL)
    expected = F.cross_entropy(model.classify(HEAD, z), batch["y"], reduction="none")
    if mu:
        expected = expected + mu * model_contrastive_loss(z, model.represent(batch, mixing=GLOBAL),
                                                          model.represent(batch, mixing=PREVIOUS), tau=tau)
        assert terms.parts["loss_con"] > 0
    torch.testing.assert_close(terms.per_example, expected)
    model.calls.clear()
    model.zero_grad()
    moon_objective(model, batch, mu=mu, tau=tau).total().backward()
    assert model.calls == ([LOCAL, GLOBAL, PREVIOUS] if mu else [LOCAL])  # mu = 0 skips the frozen passes
    assert all(p.grad is not None for s in LOCAL_SETS for p in model.adapters[s].parameters())
    assert all(p.grad is None for s in GLOBAL_SETS + PREVIOUS_SETS for p in model.adapters[s].parameters())


# ---- one round with a tiny adapter client ---------------------------------------------------------

@pytest.fixture(scope="module")
def moon_client():
    from nlp_models.backbone import tiny_bert
    from nlp_models.data.cross_task import ClientData
    from nlp_models.frozen_prefix import CachedSplit, build_prefix_cache

    backbone = tiny_bert(layers=2, hidden=32, heads=2).requires_grad_(False).eval()
    g = torch.Generator().manual_seed(0)

    def split(n):  # cached prefix states of random token ids (no tokenizer, no corpus)
        ids = torch.randint(1000, 3000, (n, 10), generator=g)
        mask = torch.ones_like(ids)
        mask[::2, 6:] = 0
        cache = build_prefix_cache(backbone, ids, mask, split=1, progress=False)
        return CachedSplit(cache.hidden, cache.attention_mask, (ids[:, 0] > 2000).long())

    data = ClientData(client_id=1, key="toy", title="toy", num_labels=2, split_layer=1,
                      splits={"train": split(12), "validation": split(4), "test": split(4)})
    return backbone, data


def _trainer(moon_client):
    from fl_algorithms.training.adapter_trainer import MOON_MODEL, AdapterTrainer, TrainConfig

    backbone, data = moon_client
    return AdapterTrainer(data=data, backbone=backbone, spec=MOON_MODEL, bottleneck=4, head_hidden=8,
                          config=TrainConfig(batch_size=4, lr=1e-2), seed=0)


def _sets(trainer, names):
    from nlp_models.adapters import flatten_set

    return np.concatenate([flatten_set(trainer.model.top, name) for name in names])


def _update(algorithm, trainer, broadcast, state, round):
    return algorithm.client_update(broadcast=broadcast,
                                   client=ClientContext(client_id=1, state=state, trainer=trainer, round=round))


def test_one_round_uploads_the_masked_delta_and_keeps_the_previous_adapters(moon_client):
    trainer = _trainer(moon_client)
    algorithm = MOON()
    state = algorithm.init_state(initial=trainer.get_shared())
    broadcast = dict(algorithm.configure_round(round=1, state=state))
    assert trainer.trainable_count() == trainer.shared_count() + sum(p.numel() for p in trainer.model.heads.parameters())

    upload, client_state = _update(algorithm, trainer, broadcast, {}, 1)
    assert set(upload.masked) == {PART} and not upload.released and not upload.sealed
    assert len(upload.masked[PART]) == trainer.shared_count() == broadcast[PART].size
    assert upload.masked[PART].weight == trainer.num_examples == 12
    w_1 = trainer.get_shared()[PART]
    assert not np.allclose(w_1, broadcast[PART])  # it trained
    np.testing.assert_array_equal(_sets(trainer, GLOBAL_SETS), broadcast[PART])  # z_glob's frozen copy: w^t
    np.testing.assert_array_equal(_sets(trainer, PREVIOUS_SETS), w_1)  # z_prev's next round: w_i at the round's end
    assert client_state == {PREVIOUS_ROUND: 1}
    assert upload.metrics["loss_con"] == pytest.approx(math.log(2), abs=1e-6)  # first round: z_prev = z_glob

    # the previous adapters survive evaluation with the global parameters and a checkpoint round trip
    algorithm.evaluate(parameters=broadcast, client=ClientContext(client_id=1, state=client_state, trainer=trainer,
                                                                  round=1), split="test")
    np.testing.assert_array_equal(_sets(trainer, PREVIOUS_SETS), w_1)
    twin = _trainer(moon_client)
    twin.load_state_dict(trainer.state_dict())
    np.testing.assert_array_equal(_sets(twin, PREVIOUS_SETS), w_1)

    # round 2 from a new global model: z_prev now differs from z_glob, and the resumed twin repeats it exactly
    broadcast_2 = {PART: broadcast[PART] + np.random.default_rng(0).normal(0, 0.05, broadcast[PART].size).astype(np.float32)}
    upload_2, state_2 = _update(algorithm, trainer, broadcast_2, client_state, 2)
    twin_upload, _ = _update(algorithm, twin, broadcast_2, dict(client_state), 2)
    assert abs(upload_2.metrics["loss_con"] - math.log(2)) > 1e-4
    assert twin_upload.metrics == upload_2.metrics
    np.testing.assert_array_equal(twin.get_shared()[PART], trainer.get_shared()[PART])
    assert state_2 == {PREVIOUS_ROUND: 2}


def test_mu_changes_the_update_once_there_is_a_previous_model(moon_client):
    results = {}
    for mu in (0.0, 1.0):
        trainer, algorithm = _trainer(moon_client), MOON(mu=mu)
        broadcast = {PART: trainer.get_shared()[PART]}
        _, state = _update(algorithm, trainer, broadcast, {}, 1)
        after_1 = trainer.get_shared()[PART]
        broadcast_2 = {PART: broadcast[PART] + 0.05}
        _update(algorithm, trainer, broadcast_2, state, 2)
        results[mu] = after_1, trainer.get_shared()[PART]
    # round 1: z_prev = z_glob, so l_con has no gradient and mu changes nothing (as in the authors' code)
    np.testing.assert_array_equal(results[0.0][0], results[1.0][0])
    assert not np.allclose(results[0.0][1], results[1.0][1], atol=1e-6)


def test_hyperparameters_and_parts_are_validated():
    with pytest.raises(ValueError, match="mu"):
        MOON(mu=-1.0)
    with pytest.raises(ValueError, match="tau"):
        MOON(tau=0.0)
    with pytest.raises(ValueError, match="exactly"):
        MOON().init_state(initial={PART: np.zeros(3), "head": np.zeros(2)})
