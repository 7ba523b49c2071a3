"""FedOPT's server rules against the paper's Algorithm 2 written out in numpy (in the paper's sign
convention, x + eta m / (sqrt(v) + tau), while the code steps along g = -Delta)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedopt import (SERVER_OPTIMIZERS, FedAdagrad, FedAdam, FedAvgM, FedOpt, FedYogi)
from fl_algorithms.api import _SECURE_LAYER, AggregateView, GroupAggregate

PARTS = {"body": 5, "head": 3}
ROUNDS = 3


def view_of(deltas: dict[str, np.ndarray], *, round: int = 1) -> AggregateView:
    """The view the secure layer would build for these mean updates (two contributors)."""
    groups = {k: GroupAggregate(mean=np.asarray(d), total_weight=2.0, count=2, error_bound=0.0) for k, d in deltas.items()}
    return AggregateView(round=round, groups=groups, released={}, contributors=frozenset({1, 2}), capability=_SECURE_LAYER)


def run(algorithm: FedOpt | FedAvg, x0: dict[str, np.ndarray], rounds: list[dict[str, np.ndarray]]) -> dict:
    state = algorithm.init_state(initial=x0)
    for t, deltas in enumerate(rounds, start=1):
        state = algorithm.server_update(state=state, view=view_of(deltas, round=t))
    return state


def algorithm_2(rule: str, x0: np.ndarray, deltas: list[np.ndarray], *, eta: float, beta1: float, beta2: float,
                tau: float, dtype=np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reddi et al. Algorithm 2 (and FedAvgM for 'sgdm'), m_{-1} = 0, v_{-1} = tau^2: (x_T, m_T, v_T)."""
    x, m, v = x0.astype(dtype), np.zeros_like(x0, dtype=dtype), np.full_like(x0, tau**2, dtype=dtype)
    for d in (np.asarray(d, dtype=dtype) for d in deltas):
        if rule == "sgdm":
            m = beta1 * m + d
            x = x + eta * m
            continue
        m = beta1 * m + (1 - beta1) * d
        if rule == "adagrad":
            v = v + d * d
        elif rule == "adam":
            v = beta2 * v + (1 - beta2) * d * d
        else:
            v = v - (1 - beta2) * d * d * np.sign(v - d * d)
        x = x + eta * m / (np.sqrt(v) + tau)
    return x, m, v


def make(rule: str, **kw) -> FedOpt:
    return FedOpt(server_optimizer=rule, **kw)


unit = st.floats(-1, 1, width=32, allow_subnormal=False)
deltas_strategy = st.lists(st.fixed_dictionaries({k: arrays(np.float32, n, elements=unit) for k, n in PARTS.items()}),
                           min_size=ROUNDS, max_size=ROUNDS)


@settings(max_examples=60, deadline=None)
@given(rule=st.sampled_from(SERVER_OPTIMIZERS), deltas=deltas_strategy,
       x0=st.fixed_dictionaries({k: arrays(np.float32, n, elements=unit) for k, n in PARTS.items()}),
       eta=st.floats(1e-3, 1.0), beta1=st.floats(0.0, 0.99), beta2=st.floats(0.5, 0.999), tau=st.floats(1e-4, 0.1))
def test_each_rule_follows_algorithm_2_over_three_rounds(rule, deltas, x0, eta, beta1, beta2, tau):
    state = run(make(rule, server_lr=eta, beta1=beta1, beta2=beta2, tau=tau), x0, deltas)
    for part in PARTS:
        x, m, v = algorithm_2(rule, x0[part], [d[part] for d in deltas], eta=eta, beta1=beta1, beta2=beta2, tau=tau)
        np.testing.assert_allclose(state[f"params.{part}"], x, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(-state[f"opt.m.{part}"], m, rtol=1e-5, atol=1e-7)  # the code stores m for g = -Delta
        if rule != "sgdm":
            np.testing.assert_allclose(state[f"opt.v.{part}"], v, rtol=1e-5, atol=1e-12)
        assert state[f"params.{part}"].dtype == np.float32


@pytest.mark.parametrize("rule", SERVER_OPTIMIZERS)
def test_each_rule_matches_a_float64_recurrence(rule):
    rng = np.random.default_rng(7)
    x0 = {k: rng.normal(size=n).astype(np.float32) for k, n in PARTS.items()}
    deltas = [{k: (0.1 * rng.normal(size=n)).astype(np.float32) for k, n in PARTS.items()} for _ in range(ROUNDS)]
    hyper = dict(eta=0.3, beta1=0.8, beta2=0.95, tau=1e-2)
    state = run(make(rule, server_lr=0.3, beta1=0.8, beta2=0.95, tau=1e-2), x0, deltas)
    for part in PARTS:
        x, _, _ = algorithm_2(rule, x0[part], [d[part] for d in deltas], dtype=np.float64, **hyper)
        np.testing.assert_allclose(state[f"params.{part}"], x, rtol=1e-5, atol=1e-6)
        assert not np.allclose(x, x0[part], atol=1e-3)  # the rounds moved the model: the check is not vacuous


@settings(max_examples=40, deadline=None)
@given(deltas=deltas_strategy, x0=st.fixed_dictionaries({k: arrays(np.float32, n, elements=unit) for k, n in PARTS.items()}))
def test_fedavgm_without_momentum_and_unit_lr_is_fedavg_exactly(deltas, x0):
    avgm, avg = run(FedAvgM(beta1=0.0, server_lr=1.0), x0, deltas), run(FedAvg(), x0, deltas)
    for part in PARTS:
        np.testing.assert_array_equal(avgm[f"params.{part}"], avg[f"params.{part}"])


def test_fedavgm_momentum_accumulates_updates():
    x0 = {"w": np.zeros(2, np.float32)}
    d1, d2 = np.array([1.0, -2.0], np.float32), np.array([0.5, 0.5], np.float32)
    state = run(FedAvgM(beta1=0.5, server_lr=1.0), x0, [{"w": d1}, {"w": d2}])
    # x_1 = d1; m_2 = 0.5 d1 + d2; x_2 = d1 + 0.5 d1 + d2 (FedAvg would give d1 + d2)
    np.testing.assert_allclose(state["params.w"], 1.5 * d1 + d2)


@pytest.mark.parametrize(("cls", "rule", "name"), [(FedAvgM, "sgdm", "fedavgm"), (FedAdagrad, "adagrad", "fedadagrad"),
                                                   (FedAdam, "adam", "fedadam"), (FedYogi, "yogi", "fedyogi")])
def test_named_variants_are_fedopt_with_the_rule_fixed(cls, rule, name):
    algo = cls(server_lr=0.1, beta1=0.7)
    assert algo.name == name and algo.server_optimizer == rule and isinstance(algo, FedOpt)
    rng = np.random.default_rng(1)
    x0 = {"w": rng.normal(size=4).astype(np.float32)}
    deltas = [{"w": rng.normal(size=4).astype(np.float32)} for _ in range(ROUNDS)]
    a, b = run(algo, x0, deltas), run(FedOpt(server_optimizer=rule, server_lr=0.1, beta1=0.7), x0, deltas)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_fedopt_keeps_its_name_and_adam_default():
    algo = FedOpt()
    assert algo.name == "fedopt" and algo.server_optimizer == "adam"


def test_only_adaptive_rules_keep_a_second_moment_starting_at_tau_squared():
    x0 = {"w": np.ones(3, np.float32)}
    assert "opt.v.w" not in FedAvgM().init_state(initial=x0)
    for rule in ("adagrad", "adam", "yogi"):
        np.testing.assert_allclose(make(rule, tau=0.01).init_state(initial=x0)["opt.v.w"], 1e-4, rtol=1e-6)


def test_server_sgdm_state_from_an_older_checkpoint_with_v_still_updates():
    old = make("sgdm").init_state(initial={"w": np.ones(2, np.float32)}) | {"opt.v.w": np.full(2, 1e-6, np.float32)}
    new = make("sgdm", server_lr=1.0, beta1=0.0).server_update(state=old, view=view_of({"w": np.array([1.0, 2.0], np.float32)}))
    np.testing.assert_array_equal(new["params.w"], [2.0, 3.0])


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(server_optimizer="rmsprop"), "server_optimizer must be one of .*got 'rmsprop'"),
    (dict(server_lr=0.0), "server_lr must be positive"), (dict(beta1=1.0), r"beta1 and beta2 must be in \[0, 1\)"),
    (dict(beta2=-0.1), r"beta1 and beta2 must be in \[0, 1\)"), (dict(tau=0.0), "tau must be positive")])
def test_rejects_bad_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedOpt(**kwargs)


def one_step_v(rule: str, v: np.ndarray, delta: np.ndarray, *, beta2: float) -> np.ndarray:
    algo = make(rule, beta2=beta2)
    state = algo.init_state(initial={"w": np.zeros_like(v)}) | {"opt.v.w": v}
    return algo.server_update(state=state, view=view_of({"w": delta}))["opt.v.w"].astype(np.float64)


positive = st.floats(0.0009765625, 10.0, width=32)


@settings(max_examples=60, deadline=None)
@given(v=arrays(np.float32, 6, elements=positive), delta=arrays(np.float32, 6, elements=st.floats(-3, 3, width=32)),
       beta2=st.floats(0.5, 0.999))
def test_yogi_moves_v_the_way_adam_does_but_by_beta2_free_additive_steps(v, delta, beta2):
    v64, d2 = v.astype(np.float64), delta.astype(np.float64) ** 2
    adam, yogi, adagrad = (one_step_v(r, v, delta, beta2=beta2) - v64 for r in ("adam", "yogi", "adagrad"))
    slack = 1e-5 * (v64 + d2) + 1e-9
    clear = np.abs(v64 - d2) > slack  # away from v = Delta^2, where float32 rounding decides the sign
    # both grow exactly where Delta^2 > v and shrink where Delta^2 < v; Yogi holds v still at Delta = 0
    visible = clear & ((1 - beta2) * d2 > 1e-5 * v64 + 1e-9)  # Yogi's step shows in float32
    assert np.all(np.sign(yogi[visible]) == np.sign(adam[visible]))
    assert np.all(np.sign(adam[clear]) == np.sign(d2 - v64)[clear])
    assert np.all(yogi[delta == 0] == 0) and np.all(adam[delta == 0] < 0)
    # Yogi's change has size (1 - beta2) Delta^2 whatever v is; Adam's is (1 - beta2) |Delta^2 - v|
    np.testing.assert_allclose(np.abs(yogi[clear]), (1 - beta2) * d2[clear], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.abs(adam), (1 - beta2) * np.abs(d2 - v64), rtol=1e-4, atol=1e-5)
    # so where v >> Delta^2 (v >= 2 Delta^2) Yogi shrinks v no faster than Adam, and never below beta2 v
    shrink = clear & (v64 >= 2 * d2 + slack)
    assert np.all(-yogi[shrink] <= -adam[shrink] + slack[shrink])
    assert np.all(v64 + yogi >= beta2 * v64 - slack)
    # Adagrad's v never decreases, and grows by Delta^2 exactly
    assert np.all(adagrad >= 0)
    np.testing.assert_allclose(adagrad, d2, rtol=1e-4, atol=1e-5)
