"""AdaFedSelectKD / AdaFedKD (fl_algorithms.algorithms.adafedselectkd): Eqs. 6-8 and the client update."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from fl_algorithms.algorithms.adafedselectkd import (ADAPTER_PART, GLOBAL, LOCAL, AdaFedKD, AdaFedSelectKD,
                                                     DistillObjective, scaled_threshold, selective_kd_loss)
from fl_algorithms.api import ClientContext
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator


def _logp(shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).log_softmax(-1)


def test_adafedkd_is_cross_entropy_plus_lambda_times_the_mean_kl_from_teacher_to_student():
    student, teacher = _logp((2, 3, 7), 0), _logp((2, 3, 7), 1)
    target = torch.tensor([[1, 2, -100], [0, 6, 3]])
    terms = selective_kd_loss(student, teacher, target, lam=0.2, threshold=None)
    valid = target != -100
    ce = F.nll_loss(student[valid], target[valid])
    kl = F.kl_div(student[valid], teacher[valid], log_target=True, reduction="batchmean")  # KL(teacher || student)
    assert float(terms.loss) == pytest.approx(float(ce + 0.2 * kl), rel=1e-6)
    assert terms.tokens == 5 and terms.selected == 5
    assert terms.kl == pytest.approx(float(kl), rel=1e-6) and terms.cross_entropy == pytest.approx(float(ce), rel=1e-6)


def test_selection_keeps_exactly_the_tokens_where_the_teacher_is_confident():
    vocab = 8
    confident = torch.full((vocab,), -20.0)
    confident[3] = 0.0
    teacher = torch.stack([confident.log_softmax(-1), torch.zeros(vocab).log_softmax(-1)])[None]  # entropy ~0, ln 8
    student = _logp((1, 2, vocab), 2)
    target = torch.tensor([[3, 1]])
    picked = selective_kd_loss(student, teacher, target, threshold=1.0)
    assert picked.selected == 1 and picked.tokens == 2
    kl_first = float((teacher[0, 0].exp() * (teacher[0, 0] - student[0, 0])).sum())
    assert picked.kl == pytest.approx(kl_first / 2, rel=1e-5)  # averaged over all target tokens
    assert selective_kd_loss(student, teacher, target, threshold=math.log(vocab) + 0.1).selected == 2
    none = selective_kd_loss(student, teacher, target, threshold=1e-9)
    assert none.selected == 0 and float(none.loss) == pytest.approx(none.cross_entropy)


def test_only_the_student_gets_a_gradient():
    student = _logp((1, 2, 5), 0).requires_grad_(True)
    teacher = _logp((1, 2, 5), 1).requires_grad_(True)
    selective_kd_loss(student, teacher, torch.tensor([[0, 4]]), threshold=None).loss.backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert teacher.grad is None


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), threshold=st.floats(0.05, 3.0), lam=st.floats(0.0, 2.0),
       scale=st.floats(0.1, 8.0))
def test_distillation_never_lowers_the_loss_below_cross_entropy_and_the_share_is_a_share(seed, threshold, lam, scale):
    student, teacher = _logp((3, 4, 6), seed, scale), _logp((3, 4, 6), seed + 1, scale)
    target = torch.randint(0, 6, (3, 4), generator=torch.Generator().manual_seed(seed))
    target[0, 3] = -100
    terms = selective_kd_loss(student, teacher, target, lam=lam, threshold=threshold)
    assert terms.kl >= -1e-6 and float(terms.loss) >= terms.cross_entropy - 1e-5
    assert 0 <= terms.selected <= terms.tokens == 11
    everything = selective_kd_loss(student, teacher, target, lam=lam, threshold=None)
    assert terms.kl <= everything.kl + 1e-6  # selection removes terms, never adds


def test_bad_inputs_are_refused():
    student = _logp((1, 2, 5), 0)
    with pytest.raises(ValueError, match="shapes"):
        selective_kd_loss(student, _logp((1, 3, 5), 1), torch.tensor([[0, 1]]), threshold=None)
    with pytest.raises(ValueError, match="no target"):
        selective_kd_loss(student, student, torch.tensor([[-100, -100]]), threshold=None)
    with pytest.raises(ValueError, match="a positive threshold"):
        DistillObjective(threshold=0.0)
    with pytest.raises(ValueError, match="a positive threshold"):
        AdaFedSelectKD(threshold=-1.0)


def test_the_papers_threshold_scales_with_the_maximum_entropy_of_the_vocabulary():
    assert scaled_threshold(50_265) == pytest.approx(5.0)
    assert scaled_threshold(30_522) == pytest.approx(4.77, abs=0.005)
    with pytest.raises(ValueError, match="vocab_size must be at least 2"):
        scaled_threshold(1)


class ToyDistillModel(torch.nn.Module):
    """Two 'adapter' vectors added to fixed logits: log p = log_softmax(base + A)."""

    def __init__(self, vocab=6, length=3):
        super().__init__()
        self.base = torch.randn(length, vocab, generator=torch.Generator().manual_seed(0))
        self.adapters = torch.nn.ParameterDict({GLOBAL: torch.nn.Parameter(torch.zeros(vocab)),
                                                LOCAL: torch.nn.Parameter(torch.zeros(vocab))})

    def adapter_log_probs(self, batch, *, adapter):
        return (self.base + self.adapters[adapter]).log_softmax(-1).expand(batch.shape[0], -1, -1)

    def targets(self, batch):
        return batch


class ToyDistillTrainer:
    def __init__(self, n=4, seed=1):
        self.model = ToyDistillModel()
        self.num_examples = n
        self.batch = torch.randint(0, 6, (n, 3), generator=torch.Generator().manual_seed(seed))
        self.loaded = []

    def load_adapter_set(self, name, vector):
        self.loaded.append((name, np.array(vector, dtype=np.float64)))
        with torch.no_grad():
            self.model.adapters[name].copy_(torch.as_tensor(vector))

    def adapter_vector(self, name):
        return self.model.adapters[name].detach().numpy().astype(np.float64).copy()

    def fit(self, *, epochs, objective, round=None):
        self.model.adapters[GLOBAL].requires_grad_(False)  # A_g is a parameter container, never optimised
        opt = torch.optim.SGD([self.model.adapters[LOCAL]], lr=0.5)
        for _ in range(epochs):
            opt.zero_grad()
            objective(self.model, self.batch).backward()
            opt.step()
        return {"loss": 0.0}


@pytest.mark.parametrize("protocol", ["plain", "secagg+"])
def test_the_next_global_adapter_is_the_weighted_mean_of_the_local_ones_and_each_client_keeps_its_own(protocol):
    algorithm = AdaFedSelectKD(threshold=2.0, local_epochs=2)
    state = algorithm.init_state(initial={ADAPTER_PART: np.zeros(6)})
    broadcast = algorithm.configure_round(round=1, state=state)
    trainers = {1: ToyDistillTrainer(n=4, seed=1), 2: ToyDistillTrainer(n=12, seed=2)}
    uploads, states = {}, {}
    for cid, trainer in trainers.items():
        uploads[cid], states[cid] = algorithm.client_update(
            broadcast=broadcast, client=ClientContext(client_id=cid, state={}, trainer=trainer, round=1))
        assert 0.0 <= uploads[cid].metrics["kd_token_share"] <= 1.0
        np.testing.assert_array_equal(trainer.adapter_vector(GLOBAL), np.zeros(6))  # A_g untouched by training
    local = {cid: states[cid][LOCAL] for cid in trainers}
    assert not np.allclose(local[1], 0.0) and not np.allclose(local[1], local[2])
    aggregator = SecureAggregator(SecureAggregationConfig(protocol=protocol, clip=4.0, max_weight=100, max_clients=2,
                                                          min_release_group=2))
    view = aggregator.aggregate(round=1, uploads=uploads)
    got = algorithm.shared_parameters(algorithm.server_update(state=state, view=view))[ADAPTER_PART]
    np.testing.assert_allclose(got, (4 * local[1] + 12 * local[2]) / 16,
                               atol=view.groups[ADAPTER_PART].error_bound + 1e-6)
    # next round: A_g takes the server's parameters, A_l continues from the client's own state
    trainer = ToyDistillTrainer(n=4, seed=1)
    algorithm.client_update(broadcast={ADAPTER_PART: got},
                            client=ClientContext(client_id=1, state=states[1], trainer=trainer, round=2))
    assert [name for name, _ in trainer.loaded] == [GLOBAL, LOCAL]
    np.testing.assert_allclose(trainer.loaded[0][1], got)
    np.testing.assert_allclose(trainer.loaded[1][1], local[1])  # A_l resumes from the client's own, not from A_g
    np.testing.assert_allclose(trainer.adapter_vector(GLOBAL), got, rtol=1e-6)


def test_adafedkd_distils_every_token():
    trainer = ToyDistillTrainer()
    upload, _ = AdaFedKD().client_update(broadcast={ADAPTER_PART: np.zeros(6)},
                                         client=ClientContext(client_id=1, state={}, trainer=trainer, round=1))
    assert upload.metrics["kd_token_share"] == 1.0
    with pytest.raises(ValueError, match="exactly the part"):
        AdaFedKD().init_state(initial={"decoder": np.zeros(3)})
