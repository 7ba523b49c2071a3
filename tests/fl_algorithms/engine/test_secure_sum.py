"""The secure layer: DDP releases, transcripts, and the limits it enforces (cohort size, survivors, disclosure)."""
import numpy as np
import pytest

from dp.distributed import DistributedDPConfig, InsufficientNoiseError, TooManyClientsError
from dp.leakage.transcript import Transcript
from dp.ledger import Ledger, LedgerConfig, Observer, PrivacyUnit
from dp.released import Released
from fl_algorithms.algorithms.group_fedavg import GroupFedAvg
from fl_algorithms.api import Masked, Upload
from fl_algorithms.engine.secure_sum import Layout, SecureAggregationConfig, SecureAggregator, SecureRoundStats
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.tasks.toy import toy_trainer
from secagg.disclosure_guard import DisclosureError
from secagg.encoding import TooManySummandsError
from secagg.messages import AbortError


def _uploads(n=6, d=40, seed=0):
    rng = np.random.default_rng(seed)
    xs = {c: rng.normal(0, 0.05, d) for c in range(1, n + 1)}
    return xs, {c: Upload(masked={"a": Masked(x[:30], weight=1.0), "b": Masked(x[30:], weight=1.0)}) for c, x in xs.items()}


@pytest.mark.parametrize("protocol", ["secagg+", "lightsecagg"])
def test_distributed_dp_sum_is_released_noisy_and_charged(protocol):
    xs, ups = _uploads()
    ledger = Ledger(LedgerConfig(delta=1e-5))
    cfg = SecureAggregationConfig(protocol=protocol, distributed_dp=DistributedDPConfig(
        l2_clip=1.0, noise_multiplier=0.5, expected_clients=6, min_clients=4, bits=20))
    agg = SecureAggregator(cfg, ledger=ledger)
    views = [agg.aggregate(round=r, uploads=ups) for r in (1, 2)]
    exact = np.mean(list(xs.values()), axis=0)
    got = np.concatenate([views[0].mean("a"), views[0].mean("b")])
    err = got - exact
    # central noise stddev on the mean: z C / n = 0.5 / 6 per coordinate after rotation (roughly)
    assert 0.2 * 0.5 / 6 < err.std() < 5 * 0.5 / 6
    assert isinstance(views[0].released["model-update"][0], Released)
    eps1 = ledger.epsilon(1, unit=PrivacyUnit.CLIENT, observer=Observer.SERVER)
    assert np.isfinite(eps1) and eps1 > 0


def test_ddp_without_ledger_is_refused():
    cfg = SecureAggregationConfig(distributed_dp=DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0))
    with pytest.raises(ValueError, match="ledger"):
        SecureAggregator(cfg)


def test_transcript_records_what_the_server_saw():
    xs, ups = _uploads(n=4)
    plain_tr, secure_tr = Transcript(protocol="plain"), Transcript(protocol="secagg+")
    SecureAggregator(SecureAggregationConfig(protocol="plain", clip=1.0, max_weight=1.0, max_clients=8,
                                             min_release_group=4), transcript=plain_tr).aggregate(round=1, uploads=ups)
    SecureAggregator(SecureAggregationConfig(protocol="secagg+", clip=1.0, max_weight=1.0, max_clients=8,
                                             min_release_group=4), transcript=secure_tr).aggregate(round=1, uploads=ups)
    assert set(plain_tr.individuals(1, "a")) == {1, 2, 3, 4}
    np.testing.assert_allclose(plain_tr.individuals(1, "a")[2], xs[2][:30], atol=1e-6)
    assert not secure_tr.individuals(1, "a")
    np.testing.assert_allclose(secure_tr.aggregate(1, "a").mean, np.mean([x[:30] for x in xs.values()], axis=0), atol=1e-6)


# ---- limits ---------------------------------------------------------------------------------------
def _exact(**kw) -> SecureAggregator:
    return SecureAggregator(SecureAggregationConfig(**{"protocol": "secagg+", "clip": 1.0, "max_weight": 1.0,
                                                       "max_clients": 16, **kw}))


def _ring_sum(agg: SecureAggregator, uploads, *, round: int):
    """(layout, ring sum) of the clients' encodings, summed without a protocol (what it would output)."""
    inputs = {c: agg.client_encode(u, parts=None, round=round, client_id=c) for c, u in uploads.items()}
    acc = np.zeros(agg.input_length(next(iter(inputs.values())).layout), dtype=np.uint32)
    for enc in inputs.values():
        agg.config.ring.add_(acc, enc.vector)
    return next(iter(inputs.values())).layout, acc


def test_a_cohort_above_max_clients_is_refused_before_any_client_encodes(monkeypatch):
    _, ups = _uploads(n=6)
    agg = SecureAggregator(SecureAggregationConfig(protocol="secagg+", clip=1.0, max_weight=1.0, max_clients=5))
    agg.check_members(5)
    with pytest.raises(TooManySummandsError, match="6 contributors exceed the encoding's max_clients=5"):
        agg.check_members(6)
    encoded = []
    monkeypatch.setattr(agg, "client_encode", lambda *a, **k: encoded.append(1))
    with pytest.raises(ValueError, match="max_clients=5"):
        agg.aggregate(round=1, uploads=ups)
    assert encoded == []
    with pytest.raises(ValueError, match="max_clients=5"):
        agg.server_protocol(round_id=1, members=range(1, 7), length=4)


def test_the_decoder_refuses_more_contributors_than_max_clients():
    _, ups = _uploads(n=6)
    big = _exact(max_clients=6)
    layout, total = _ring_sum(big, ups, round=1)
    small = _exact(max_clients=5)
    with pytest.raises(TooManySummandsError, match="6 contributors exceed the encoding's max_clients=5"):
        small.server_decode(total, layout=layout, contributors=frozenset(ups), round=1)
    groups, _ = big.server_decode(total, layout=layout, contributors=frozenset(ups), round=1)
    assert groups["a"].count == 6


def test_under_ddp_the_cohort_limit_is_expected_clients():
    agg = SecureAggregator(SecureAggregationConfig(distributed_dp=DistributedDPConfig(
        l2_clip=1.0, noise_multiplier=1.0, expected_clients=6, min_clients=5, bits=20)), ledger=Ledger())
    assert agg.max_members == 6
    agg.check_members(6)
    with pytest.raises(TooManyClientsError, match="expected_clients=6"):
        agg.check_members(7)


@pytest.mark.parametrize("protocol", ["plain", "secagg", "secagg+"])
def test_the_protocol_never_unmasks_fewer_than_the_floor(protocol):
    agg = _exact(protocol=protocol, min_release_group=6, protocol_params={"min_clients": 7})
    assert agg.protocol_params(members=8)["min_clients"] == 7  # above the floor: kept
    assert _exact(protocol=protocol, min_release_group=6).protocol_params(members=8)["min_clients"] == 6
    assert _exact(protocol=protocol, min_release_group=6).server_protocol(round_id=1, members=range(1, 9),
                                                                          length=4).min_clients == 6
    ddp = SecureAggregator(SecureAggregationConfig(protocol=protocol, distributed_dp=DistributedDPConfig(
        l2_clip=1.0, noise_multiplier=1.0, expected_clients=10, min_clients=8, bits=20)), ledger=Ledger())
    assert ddp.protocol_params(members=9, overrides={"min_clients": 2})["min_clients"] == 8
    with pytest.raises(InsufficientNoiseError, match="7 members cannot reach distributed_dp min_clients"):
        ddp.protocol_params(members=7)
    with pytest.raises(DisclosureError, match="5 members cannot reach min_release_group=6"):
        _exact(protocol=protocol, min_release_group=6).protocol_params(members=5)


def test_lightsecagg_target_survivors_is_raised_to_the_floor():
    agg = _exact(protocol="lightsecagg", min_release_group=6, protocol_params={"target_survivors": 0.5, "privacy": 2})
    assert agg.protocol_params(members=10)["target_survivors"] == 6
    assert agg.protocol_params(members=16)["target_survivors"] == 8
    assert agg.server_protocol(round_id=1, members=range(1, 11), length=4).target == 6


@pytest.mark.parametrize("protocol, params, drop_stage", [
    ("secagg+", {}, "masked"),
    ("lightsecagg", {"target_survivors": 0.5, "privacy": 2}, "masked_input"),
])
def test_a_ddp_sum_with_fewer_survivors_than_calibrated_aborts_before_unmasking(protocol, params, drop_stage):
    """n_min = 6 of 8: with 5 survivors the protocol itself aborts; nothing is opened, nothing charged.
    (With the protocol's own minimum, 2, or a target of half the cohort, it would unmask the sum.)"""
    _, ups = _uploads(n=8)
    ledger = Ledger(LedgerConfig(delta=1e-5))
    agg = SecureAggregator(SecureAggregationConfig(protocol=protocol, protocol_params=params, distributed_dp=(
        DistributedDPConfig(l2_clip=1.0, noise_multiplier=0.5, expected_clients=8, min_clients=6, bits=20))),
        ledger=ledger)
    with pytest.raises(AbortError, match="round aborted at stage 'masked(_input)?': 5 clients left, 6 required") as info:
        agg.aggregate(round=1, uploads=ups, drop_at={drop_stage: {1, 2, 3}})
    assert info.value.survivors == 5 and info.value.required == 6
    assert ledger.state_dict() == Ledger(LedgerConfig(delta=1e-5)).state_dict()
    view = agg.aggregate(round=2, uploads=ups, drop_at={drop_stage: {1, 2}})  # 6 survivors: released
    assert view.contributors == frozenset(range(3, 9))


@pytest.mark.parametrize("kw, match", [
    (dict(protocol_params={"min_clients": 3}), "min_clients=3 is below min_release_group=5"),
    (dict(protocol="lightsecagg", protocol_params={"target_survivors": 4}), "target_survivors=4 is below"),
    (dict(protocol_params={"min_clients": 4}, distributed_dp=DistributedDPConfig(
        l2_clip=1.0, noise_multiplier=1.0, expected_clients=8, min_clients=6)), "below distributed_dp min_clients"),
    (dict(min_release_group=1), "min_release_group must be an int >= 2"),
    (dict(min_release_group=True), "min_release_group must be an int, got True"),
    (dict(max_clients=0), "max_clients must be positive"),
    (dict(max_clients=4), "min_release_group=5 exceeds max_clients=4"),
])
def test_configs_that_would_open_a_forbidden_sum_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        SecureAggregationConfig(**kw)


def test_describe_states_the_release_rules():
    cfg = SecureAggregationConfig(min_release_group=7, fixed_parts=["b", "a", "a"])
    assert cfg.fixed_parts == ("a", "b")
    doc = cfg.describe()
    assert doc["min_release_group"] == 7 and doc["fixed_parts"] == ["a", "b"]
    assert SecureAggregationConfig().describe()["min_release_group"] == 5


def test_the_guard_refuses_a_noise_free_sum_below_min_release_group_in_decode():
    """Third line (after protocol_params and the protocol's own minimum): the decoder's guard."""
    _, ups = _uploads(n=4)
    agg = _exact()
    layout, total = _ring_sum(agg, ups, round=1)
    with pytest.raises(DisclosureError, match=r"min_release_group=5\).*4 client\(s\) is below the minimum cohort 5"):
        agg.server_decode(total, layout=layout, contributors=frozenset(ups), round=1, sum_name="s")
    assert agg.guard.keys() == []  # nothing recorded
    with pytest.raises(DisclosureError, match="4 members cannot reach min_release_group=5"):
        agg.aggregate(round=1, uploads=ups)


def test_two_sums_of_one_part_in_a_round_cannot_be_differenced():
    _, ups = _uploads(n=7)
    agg = _exact()
    six = {c: u for c, u in ups.items() if c != 7}
    layout, total6 = _ring_sum(agg, six, round=1)
    _, total7 = _ring_sum(agg, ups, round=1)
    agg.server_decode(total6, layout=layout, contributors=frozenset(six), round=1, sum_name="first")
    with pytest.raises(DisclosureError, match="sum 'second'") as info:
        agg.server_decode(total7, layout=layout, contributors=frozenset(ups), round=1, sum_name="second")
    assert info.value.exposed == (7,)
    # another round's vectors are fresh model updates: the history of round 1 no longer applies
    groups, _ = agg.server_decode(total7, layout=layout, contributors=frozenset(ups), round=2)
    assert set(groups) == {"a", "b"} and agg.guard.keys() == ["round 2/a", "round 2/b"]
    assert agg.state_dict()["guard"]["keys"] == {}  # per-round history is not run state


def test_a_fixed_part_is_tracked_across_rounds_and_through_a_checkpoint():
    _, ups = _uploads(n=7)
    six = {c: u for c, u in ups.items() if c != 7}
    agg = _exact(fixed_parts=("a",))
    layout, total6 = _ring_sum(agg, six, round=1)
    _, total7 = _ring_sum(agg, ups, round=2)
    agg.server_decode(total6, layout=layout, contributors=frozenset(six), round=1)
    saved = agg.state_dict()
    assert list(saved["guard"]["keys"]) == ["a"]
    with pytest.raises(DisclosureError, match=r"refused by the disclosure guard .*expose the individual vectors of clients \[7\]") as info:
        agg.server_decode(total7, layout=layout, contributors=frozenset(ups), round=2)
    assert info.value.exposed == (7,) and info.value.summary_key == "a"
    resumed = _exact(fixed_parts=("a",))
    resumed.load_state_dict(saved)
    with pytest.raises(DisclosureError, match=r"refused by the disclosure guard .*expose the individual vectors of clients \[7\]"):
        resumed.server_decode(total7, layout=layout, contributors=frozenset(ups), round=2)
    fresh = _exact(fixed_parts=("a",))  # without the checkpoint the same release would pass
    fresh.server_decode(total7, layout=layout, contributors=frozenset(ups), round=2)


def _cluster_uploads(assignment: dict[int, int], k: int = 3):
    return {c: Upload(masked={"x": Masked(np.full(4, 0.1 * c), weight=2.0, cluster=a, clusters=k)})
            for c, a in assignment.items()}


def test_cluster_indexed_sums_report_member_counts_and_refuse_small_clusters():
    agg = _exact(max_weight=2.0)
    ok = _cluster_uploads({c: c % 2 for c in range(1, 11)})  # 5 and 5, cluster 2 empty
    layout = Layout.of(ok[1])
    assert agg.input_length(layout) == 3 * (4 + 2)  # [w, w x, count] per cluster
    view = agg.aggregate(round=1, uploads=ok)
    assert [view.groups[f"x[{b}]"].count for b in range(3)] == [5, 5, 0]
    np.testing.assert_allclose(view.groups["x[0]"].mean, np.full(4, 0.6), atol=1e-6)   # clients 2, 4, .., 10
    assert view.groups["x[1]"].total_weight == pytest.approx(10.0, abs=1e-3)
    assert np.all(np.isnan(view.groups["x[2]"].mean))
    small = _cluster_uploads({c: 0 if c <= 6 else 1 for c in range(1, 11)})  # 6 and 4
    with pytest.raises(DisclosureError, match=r"'round 2/x\[1\]': a noise-free sum of 4 client"):
        agg.aggregate(round=2, uploads=small)
    assert agg.guard.rank("round 2/x") == 0  # the refused sum left no trace
    lone = _cluster_uploads({c: 0 if c <= 9 else 2 for c in range(1, 11)})  # a cluster of one
    with pytest.raises(DisclosureError, match=r"x\[2\]': a noise-free sum of 1 client"):
        agg.aggregate(round=3, uploads=lone)


def test_forged_cluster_counts_are_refused():
    agg = _exact(max_weight=2.0)
    ups = _cluster_uploads({c: c % 2 for c in range(1, 11)})
    layout, total = _ring_sum(agg, ups, round=1)
    forged = total.copy()
    forged[4 + 1] += np.uint32(3)  # cluster 0 claims 8 members
    with pytest.raises(ValueError, match="do not add up"):
        agg.server_decode(forged, layout=layout, contributors=frozenset(ups), round=1)


def test_a_forging_client_moves_count_into_a_victims_cluster_so_colluders_refuse_cluster_parts():
    """The colluding-insiders issue's attack: 11 clients, one victim alone in cluster 1, nine honest
    in cluster 0, one malicious client (id 11) that moves 4 units of count from cluster 0 into cluster 1
    (total unchanged) with zero weight there. The guard sees 'count 5' and the server decodes the
    victim's vector: cluster counts hold only against honest clients (colluders = 0, as documented).
    Declaring colluders refuses cluster-indexed parts on both sides instead."""
    assignment = {**{c: 0 for c in range(1, 10)}, 10: 1, 11: 0}
    ups = {c: Upload(masked={"x": Masked(np.full(4, 0.05 * c), weight=1.0, cluster=a, clusters=2)})
           for c, a in assignment.items()}
    agg = _exact(max_weight=1.0)
    inputs = {c: agg.client_encode(u, parts=None, round=1, client_id=c) for c, u in ups.items()}
    layout, n = inputs[1].layout, 4
    forged = inputs[11].vector.copy()
    ring = agg.config.ring
    forged[1 + n] = ring.sub_(forged[1 + n: 2 + n].copy(), np.array([4], dtype=np.uint32))[0]   # cluster 0: -4
    forged[(n + 2) + 1 + n] = (int(forged[(n + 2) + 1 + n]) + 4) % ring.modulus                 # cluster 1: +4
    total = np.zeros(agg.input_length(layout), dtype=np.uint32)
    for c, enc in inputs.items():
        ring.add_(total, forged if c == 11 else enc.vector)
    groups, _ = agg.server_decode(total, layout=layout, contributors=frozenset(ups), round=1)
    assert groups["x[1]"].count == 5                                                # the guard saw five
    np.testing.assert_allclose(groups["x[1]"].mean, np.full(4, 0.5), atol=1e-6)     # the victim's vector
    strict = _exact(max_weight=1.0, colluders=1)
    with pytest.raises(DisclosureError, match="member counts can be forged"):
        strict.client_encode(ups[1], parts=None, round=1, client_id=1)
    with pytest.raises(DisclosureError, match="member counts can be forged"):
        strict.server_decode(total, layout=layout, contributors=frozenset(ups), round=1)


def test_colluders_raise_every_protocols_survivor_floor():
    for protocol, key in (("secagg", "min_clients"), ("secagg+", "min_clients"), ("lightsecagg", "min_group")):
        agg = _exact(protocol=protocol, colluders=2, min_release_group=5)
        params = agg.protocol_params(members=12)
        assert params[key] == 5 and params["colluders"] == 2
        server = agg.server_protocol(round_id=1, members=range(1, 13), length=4)
        assert (server.min_survivors if protocol == "lightsecagg" else server.min_clients) >= 7
        with pytest.raises(DisclosureError, match="besides 2 colluders"):
            agg.protocol_params(members=6)
    plain = _exact(protocol="plain", colluders=2, min_release_group=5)
    assert plain.protocol_params(members=12)["min_clients"] == 7


def test_ddp_releases_are_recorded_as_noisy_and_allowed():
    _, ups = _uploads(n=6)
    agg = SecureAggregator(SecureAggregationConfig(distributed_dp=DistributedDPConfig(
        l2_clip=1.0, noise_multiplier=0.5, expected_clients=6, min_clients=6, bits=20)), ledger=Ledger())
    agg.aggregate(round=1, uploads=ups)
    assert agg.guard.releases("round 1/model-update") == {"exact": [], "noisy": [tuple(range(1, 7))]}


def test_in_the_engine_a_refused_release_fails_that_sum_only():
    groups = {**{c: "big" for c in range(1, 6)}, **{c: "small" for c in (6, 7, 8)}}
    config = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100,
                                                               max_clients=8))
    sim = SimulationRunner(algorithm=GroupFedAvg(groups=groups), trainers={c: toy_trainer(c) for c in groups},
                           config=config)
    initial = sim.state
    sim.run(progress=False)
    rec = sim.history[0]
    assert rec.sums == {"big": [1, 2, 3, 4, 5]}
    assert "min_release_group=5" in rec.failed["small"] and "DisclosureError" in rec.failed["small"]
    assert all(np.array_equal(sim.state[k], v) for k, v in initial.items() if k.startswith("small/"))
    assert any(not np.array_equal(sim.state[k], v) for k, v in initial.items() if k.startswith("big/"))


def test_a_parts_own_clip_is_honoured_and_counted_and_a_wider_one_is_refused():
    """`Masked(clip=)` tightens the run's fixed-point range for that part (clipped, counted), never silently
    widens it: a part asking for more than `SecureAggregationConfig.clip` is refused at encoding."""
    ups = {c: Upload(masked={"a": Masked(np.array([6.0, 0.2, -6.0, 0.1]), weight=1.0, clip=0.5),
                             "b": Masked(np.array([0.3, -0.3]), weight=1.0)}) for c in range(1, 6)}
    agg, stats = _exact(clip=1.0), SecureRoundStats()
    view = agg.aggregate(round=1, uploads=ups, stats=stats)
    np.testing.assert_allclose(view.groups["a"].mean, [0.5, 0.2, -0.5, 0.1], atol=1e-6)  # +-6 clipped to +-0.5
    np.testing.assert_allclose(view.groups["b"].mean, [0.3, -0.3], atol=1e-6)
    assert stats.clipped == 5 * 2  # two values of each client's part 'a'
    wide = {c: Upload(masked={"a": Masked(np.zeros(3), weight=1.0, clip=1000)}) for c in range(1, 6)}
    with pytest.raises(ValueError, match=r"part 'a' asks for clip 1000, above this run's secure clip 1"):
        _exact(clip=1.0).aggregate(round=1, uploads=wide)
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match="clip must be a positive number"):
            Masked(np.zeros(2), weight=1.0, clip=bad)


@pytest.mark.parametrize("protocol", ["plain", "secagg+"])
def test_a_chunked_protocol_gives_the_same_mean_as_one_message_per_input(protocol):
    """`protocol_params={'chunk': C}` sends each encoded input in chunks folded as they arrive
    (secagg/protocols/chunks.py); the released mean is the one-message mean (both exact up to encoding)."""
    xs, ups = _uploads(n=5, d=12000)
    ups = {c: Upload(masked={"a": Masked(x, weight=1.0)}) for c, x in xs.items()}
    means = {}
    for chunk in (None, 4096):
        params = {} if chunk is None else {"chunk": chunk}
        cfg = SecureAggregationConfig(protocol=protocol, clip=1.0, max_weight=1.0, max_clients=8, min_release_group=3,
                                      protocol_params=params)
        means[chunk] = SecureAggregator(cfg).aggregate(round=1, uploads=ups).mean("a")
    exact = np.mean(list(xs.values()), axis=0)
    np.testing.assert_allclose(means[4096], exact, atol=1e-5)
    np.testing.assert_allclose(means[4096], means[None], atol=2e-5)
