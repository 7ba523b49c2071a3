"""Fixed-point encoding: exact bit budget, unbiased stochastic rounding, clipping report, decoding."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg.encoding import BitBudgetError, EncodingConfig, FixedPointEncoder, TooManySummandsError
from secagg.ring import FIELD_P31, RING_2_32, Ring

FAST = settings(max_examples=40, deadline=None)
RINGS = [RING_2_32, FIELD_P31]


def _ring_sum(ring: Ring, vectors) -> np.ndarray:
    acc = np.zeros_like(vectors[0])
    for v in vectors:
        ring.add_(acc, v)
    return acc


@st.composite
def weighted_population(draw):
    ring = draw(st.sampled_from(RINGS))
    n = draw(st.integers(1, 30))
    d = draw(st.integers(1, 200))
    clip = draw(st.floats(1e-3, 1e4))
    max_weight = draw(st.floats(1e-2, 1e4))
    max_clients = draw(st.integers(n, 5000))
    cfg = EncodingConfig(clip=clip, max_weight=max_weight, max_clients=max_clients)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)  # test data only; never used for masks or rounding
    xs = [rng.normal(0.0, clip, size=d) * rng.choice([0.1, 1.0, 3.0]) for _ in range(n)]
    ws = [max_weight * float(f) for f in rng.uniform(0.05, 1.0, size=n)]
    return ring, cfg, xs, ws


@FAST
@given(weighted_population())
def test_decoded_weighted_mean_matches_float_mean_within_the_stated_bound(pop):
    ring, cfg, xs, ws = pop
    enc = FixedPointEncoder(cfg, ring=ring)
    encoded = [enc.encode(x, weight=w)[0] for x, w in zip(xs, ws)]
    for e in encoded:
        assert e.dtype == np.uint32 and e.shape == (xs[0].shape[0] + 1,)
        assert int(e.max()) < ring.modulus
    out = enc.decode(_ring_sum(ring, encoded))
    W = sum(ws)
    clipped = [np.clip(x, -cfg.clip, cfg.clip) for x in xs]
    exact = sum(w * x for w, x in zip(ws, clipped)) / W
    bound = enc.mean_error_bound(n_clients=len(xs), total_weight=W)
    assert np.max(np.abs(out.mean - exact)) <= bound
    assert abs(out.total_weight - W) <= len(xs) / enc.weight_scale
    assert np.max(np.abs(out.weighted_sum - exact * W)) <= len(xs) / enc.value_scale + 1e-9 * W * cfg.clip


def _extreme(enc: FixedPointEncoder, sign: float) -> np.ndarray:
    """An upload at max_weight with every value at (or far beyond) the clip: the largest |encoded value|."""
    c = enc.config.clip
    x = sign * np.array([c, 10 * c, 1e30, c * (1 - 1e-12)])
    e, rep = enc.encode(x, weight=enc.config.max_weight)
    assert rep.clipped == 2
    return e


@FAST
@given(
    st.sampled_from(RINGS),
    st.integers(1, 2000),
    st.floats(1e-3, 1e4),
    st.floats(1e-2, 1e4),
    st.sampled_from([1.0, -1.0]),
)
def test_never_wraps_at_max_clients_with_max_weight_and_extreme_values(ring, max_clients, clip, max_weight, sign):
    enc = FixedPointEncoder(EncodingConfig(clip=clip, max_weight=max_weight, max_clients=max_clients), ring=ring)
    signed = ring.to_signed(_extreme(enc, sign)).astype(np.int64)
    # the integer sum of max_clients such uploads (what the ring holds before reduction) stays in range
    worst_integer_sum = signed * max_clients
    assert np.all(np.abs(worst_integer_sum) < ring.half)
    out = enc.decode(ring.from_signed(worst_integer_sum), n_clients=max_clients)
    assert np.allclose(out.mean, sign * clip, rtol=1e-6, atol=enc.mean_error_bound(
        n_clients=max_clients, total_weight=max_clients * max_weight))
    assert out.total_weight == pytest.approx(max_clients * max_weight, rel=1e-6, abs=max_clients / enc.weight_scale)


@FAST
@given(st.sampled_from(RINGS), st.integers(1, 3000), st.floats(1e-2, 1e3), st.sampled_from([1.0, -1.0]))
def test_one_summand_past_max_clients_can_wrap_and_its_decode_is_refused(ring, max_clients, clip, sign):
    """The no-wrap budget is tight: max_clients + 1 extreme uploads leave the centred range, so only
    the count check stands between a cohort above max_clients and a silently wrong sum."""
    enc = FixedPointEncoder(EncodingConfig(clip=clip, max_weight=1.0, max_clients=max_clients), ring=ring)
    signed = ring.to_signed(_extreme(enc, sign)).astype(np.int64)
    over = signed * (max_clients + 1)
    assert np.any(np.abs(over) >= ring.half)  # wraps: the budget has no slack to hide a larger cohort
    wrapped = ring.from_signed(np.mod(over + ring.half, ring.modulus) - ring.half)
    with pytest.raises(TooManySummandsError, match=f"max_clients={max_clients}"):
        enc.decode(wrapped, n_clients=max_clients + 1)
    enc.decode(ring.from_signed(signed * max_clients), n_clients=max_clients)  # the limit itself is fine


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_check_count_refuses_non_counts(bad):
    enc = FixedPointEncoder(EncodingConfig(max_clients=10))
    with pytest.raises(ValueError, match="a contributor count is a positive int"):
        enc.check_count(bad)


@pytest.mark.parametrize("ring", RINGS)
def test_a_real_sum_of_max_clients_extreme_uploads_decodes_to_the_clip_value(ring):
    cfg = EncodingConfig(clip=3.0, max_weight=50.0, max_clients=300)
    enc = FixedPointEncoder(cfg, ring=ring)
    for sign in (1.0, -1.0):
        ups = [enc.encode(np.full(4, sign * 1e9), weight=50.0)[0] for _ in range(300)]
        out = enc.decode(_ring_sum(ring, ups), n_clients=300)
        bound = enc.mean_error_bound(n_clients=300, total_weight=300 * 50.0)
        assert np.all(np.abs(out.mean - sign * 3.0) <= bound)
        assert out.total_weight == pytest.approx(15000.0, abs=300 / enc.weight_scale)


def test_stochastic_rounding_is_unbiased():
    cfg = EncodingConfig(clip=1.0, max_weight=1.0, max_clients=1000)
    enc = FixedPointEncoder(cfg, ring=RING_2_32)
    fracs = np.tile([0.1, 0.3, 0.5, 0.7, 0.9], 2000)  # d = 10_000
    x = (100 + fracs) / enc.value_scale
    target = x * (1.0 * enc.value_scale)  # the exact real value being rounded, same float ops
    reps = 100
    total = np.zeros(x.shape[0], dtype=np.int64)
    ups = np.zeros(x.shape[0], dtype=np.int64)
    for _ in range(reps):
        e, _ = enc.encode(x, weight=1.0)
        v = RING_2_32.to_signed(e)
        assert set(v[1:].tolist()) <= {100, 101}
        total += v[1:]
        ups += v[1:] == 101
    for f in (0.1, 0.3, 0.5, 0.7, 0.9):
        sel = np.isclose(fracs, f)
        n = reps * int(sel.sum())
        observed = total[sel].sum() / n
        expected = target[sel].mean()
        sigma = np.sqrt(f * (1 - f) / n)
        assert abs(observed - expected) < 6 * sigma, (f, observed, expected)
        assert abs(ups[sel].sum() / n - f) < 6 * sigma  # rounds up with probability = fraction
        assert abs(expected - (100 + f)) < 1e-6


def test_weight_slot_rounding_is_unbiased():
    enc = FixedPointEncoder(EncodingConfig(clip=1.0, max_weight=1.0, max_clients=1000))
    w = 7.25 / enc.weight_scale
    slots = np.array([int(RING_2_32.to_signed(enc.encode(np.zeros(0), weight=w)[0])[0]) for _ in range(4000)])
    assert set(slots.tolist()) == {7, 8}
    assert abs(slots.mean() - 7.25) < 6 * np.sqrt(0.25 * 0.75 / slots.size)


def test_rounding_randomness_is_fresh_per_encode():
    enc = FixedPointEncoder(EncodingConfig(clip=1.0, max_clients=10))
    x = np.full(256, 0.5 / enc.value_scale + 3 / enc.value_scale)
    a, _ = enc.encode(x, weight=1.0)
    b, _ = enc.encode(x, weight=1.0)
    assert not np.array_equal(a, b)


def test_integral_values_are_encoded_exactly():
    enc = FixedPointEncoder(EncodingConfig(clip=1.0, max_clients=4), ring=FIELD_P31)
    x = np.array([-5, 0, 3, 12345]) / enc.value_scale
    assert np.all(np.abs(x) <= 1.0)
    e, _ = enc.encode(x, weight=1.0)
    assert FIELD_P31.to_signed(e[1:]).tolist() == [-5, 0, 3, 12345]


def test_clipping_is_counted_and_applied():
    enc = FixedPointEncoder(EncodingConfig(clip=2.0, max_clients=10))
    x = np.array([-3.0, -2.0, -1.0, 0.0, 2.0, 2.0000001, 50.0])
    e, rep = enc.encode(x, weight=1.0)
    assert rep.clipped == 3
    out = enc.decode(e)
    assert np.allclose(out.mean, np.clip(x, -2, 2), atol=2 * enc.mean_error_bound(n_clients=1, total_weight=1.0))


def test_clip_count_spans_chunks():
    enc = FixedPointEncoder(EncodingConfig(clip=1.0, max_clients=10))
    d = 70_000  # more than one 65_536-value chunk
    x = np.linspace(-2.0, 2.0, d)
    e, rep = enc.encode(x, weight=0.5)
    assert rep.clipped == int(np.count_nonzero(np.abs(x) > 1.0))
    out = enc.decode(e)
    assert np.max(np.abs(out.mean - np.clip(x, -1, 1))) <= enc.mean_error_bound(n_clients=1, total_weight=0.5)
    assert out.mean.shape == (d,)


@pytest.mark.parametrize(
    "cfg, ring",
    [
        (EncodingConfig(max_clients=2**31), RING_2_32),         # no room even for one level
        (EncodingConfig(max_clients=2**30), RING_2_32),         # one level, none left after the rounding margin
        (EncodingConfig(max_clients=2**30 - 1), RING_2_32),
        (EncodingConfig(max_clients=2**29), FIELD_P31),
        (EncodingConfig(max_clients=1000, clip=8.0, min_resolution=1e-9), RING_2_32),
        (EncodingConfig(max_clients=10, clip=1.0, max_weight=1e4, min_resolution=1e-6), FIELD_P31),
    ],
)
def test_impossible_budgets_are_refused_before_the_round(cfg, ring):
    with pytest.raises(BitBudgetError, match="cannot hold a sum of .* clients|no quantisation levels left|quantisation step .* exceeds the required"):
        FixedPointEncoder(cfg, ring=ring)


def test_bit_budget_error_says_what_to_lower():
    with pytest.raises(BitBudgetError, match="lower max_clients"):
        FixedPointEncoder(EncodingConfig(max_clients=1000, clip=8.0, min_resolution=1e-9))


def test_resolution_requirement_that_can_be_met_is_met():
    enc = FixedPointEncoder(EncodingConfig(max_clients=100, clip=1.0, min_resolution=1e-6))
    assert enc.step <= 1e-6


@pytest.mark.parametrize(
    "kwargs",
    [dict(clip=0.0), dict(clip=-1.0), dict(clip=float("nan")), dict(max_weight=0.0), dict(max_weight=-2.0),
     dict(max_weight=float("nan")), dict(max_clients=0), dict(max_clients=-3)],
)
def test_config_validation(kwargs):
    with pytest.raises(ValueError, match="(clip|max_weight) must be positive|max_clients must be at least 1"):
        EncodingConfig(**kwargs)


@pytest.mark.parametrize(
    "x, weight",
    [
        (np.array([0.0, np.nan]), 1.0),
        (np.array([np.inf]), 1.0),
        (np.array([-np.inf, 0.0]), 1.0),
        (np.zeros((2, 2)), 1.0),
        (np.zeros(3), 0.0),
        (np.zeros(3), -1.0),
        (np.zeros(3), 1.0 + 1e-9),
        (np.zeros(3), float("nan")),
    ],
)
def test_encode_refuses_bad_input(x, weight):
    enc = FixedPointEncoder(EncodingConfig(max_weight=1.0, max_clients=10))
    with pytest.raises(ValueError, match=r"NaN or infinity|expects a flat vector|outside \(0, 1\.0\]"):
        enc.encode(x, weight=weight)


def test_decode_refuses_a_sum_without_positive_weight():
    enc = FixedPointEncoder(EncodingConfig(max_clients=10))
    with pytest.raises(ValueError, match="decoded total weight is not positive"):
        enc.decode(np.zeros(4, dtype=np.uint32))
    with pytest.raises(ValueError, match="decoded total weight is not positive"):
        enc.decode(RING_2_32.from_signed(np.array([-5, 1, 2])))


def test_empty_vector_carries_only_the_weight():
    enc = FixedPointEncoder(EncodingConfig(max_clients=10))
    e, rep = enc.encode(np.zeros(0), weight=0.5)
    assert e.shape == (1,) and rep.clipped == 0
    out = enc.decode(e)
    assert out.mean.shape == (0,) and out.total_weight == pytest.approx(0.5, abs=1 / enc.weight_scale)


def test_error_bound_shrinks_with_fewer_max_clients():
    small = FixedPointEncoder(EncodingConfig(max_clients=10))
    large = FixedPointEncoder(EncodingConfig(max_clients=10_000))
    assert small.mean_error_bound(n_clients=5, total_weight=5.0) < large.mean_error_bound(n_clients=5, total_weight=5.0)
    assert small.step < large.step
