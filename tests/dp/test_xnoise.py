"""Dropout-exact distributed DP (XNoise): layer arithmetic, the reveal rule, and the noise a released sum
really carries at 0-40% dropout, with survivors dropping during the removal itself."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp import recompute
from dp.distributed import DistributedDPConfig, InsufficientNoiseError
from dp.ledger import Ledger, LedgerConfig
from dp.xnoise import LayeredNoise
from fl_algorithms.api import Masked, Upload
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator
from secagg import shamir
from secagg.messages import ProtocolError
from secagg.noise_layers import LayerSecrets, LayerSpec, chain, descend
from secagg.protocols.secagg import SecAggClient, SecAggServer

N, FLOOR, DIM = 10, 6, 8192


@given(floor=st.integers(1, 40), count=st.integers(0, 40), colluders=st.integers(0, 5), extra=st.integers(0, 60))
@settings(max_examples=200, deadline=None)
def test_honest_survivors_keep_exactly_the_target_for_every_count(floor, count, colluders, extra):
    noise = LayeredNoise(spec=LayerSpec(count=count, floor=floor, colluders=colluders), target_variance=7.0)
    assert noise.client_variance() == pytest.approx(7.0 / floor, rel=1e-12)  # what every client adds: unchanged
    survivors = colluders + floor + min(extra, count)  # every honest count the layers cover
    index = noise.spec.reveal_index(survivors)
    record = noise.record(survivors=survivors, index=index)
    assert record.realised_variance == pytest.approx(7.0, rel=1e-12)
    assert recompute.realised_variance(record.to_dict()) == pytest.approx(7.0, rel=1e-12)
    # one layer more would leave less than the target: the recomputation flags it
    if index + 1 < count:
        assert recompute.realised_variance({**record.to_dict(), "layer_index": index + 1}) == 0.0


@given(floor=st.integers(1, 40), count=st.integers(0, 40), colluders=st.integers(0, 5), extra=st.integers(0, 120))
@settings(max_examples=200, deadline=None)
def test_fewer_layers_than_the_survivors_reach_leave_more_noise_never_less(floor, count, colluders, extra):
    """Layers are sized by the sum's announced size (`layer_spec(members=)`); a server that understates it gives
    the clients fewer layers than the survivors reach. The released sum then keeps at least the target."""
    noise = LayeredNoise(spec=LayerSpec(count=count, floor=floor, colluders=colluders), target_variance=7.0)
    survivors = colluders + floor + extra  # any honest count from the floor up, past the layers too
    record = noise.record(survivors=survivors, index=noise.spec.reveal_index(survivors))
    assert record.realised_variance >= 7.0 * (1 - 1e-12)
    if extra <= count:
        assert record.realised_variance == pytest.approx(7.0, rel=1e-12)


def test_a_sums_layers_follow_its_size_up_to_the_ring():
    cfg = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=90, min_clients=32, exact_noise=True)
    assert cfg.layer_spec().count == 58 and cfg.layer_spec(members=50).count == 18
    assert cfg.layer_spec(members=50, colluders=2).count == 16 and cfg.layer_spec(members=500).count == 58
    assert cfg.layer_spec(members=20).count == 0  # below the floor: no layer (and no sum is opened)


def test_a_revealed_chain_secret_opens_that_layer_and_the_lower_ones_only():
    secrets = chain(shamir.random_element(), 8)
    assert descend(secrets[4], 4) == secrets[:5]
    assert all(s not in descend(secrets[4], 4) for s in secrets[5:])
    assert LayerSpec(count=8, floor=6).reveal_index(6) == -1   # at the floor nothing is removed
    assert LayerSpec(count=8, floor=6).reveal_index(7) == 0
    assert LayerSpec(count=8, floor=6, colluders=2).reveal_index(9) == 0  # colluders' noise never counts
    assert LayerSpec(count=8, floor=6).reveal_index(99) == 7


def _uploads():
    rng = np.random.default_rng(0)
    xs = {c: rng.normal(0, 0.01, DIM) for c in range(1, N + 1)}
    return xs, {c: Upload(masked={"a": Masked(x, weight=1.0)}) for c, x in xs.items()}


def _noise_ratio(*, exact: bool, drop_at, protocol="secagg+", colluders=0, mechanism="skellam"):
    """Variance of the released sum's error over the central target (z C)^2 = 1, and the ledger."""
    xs, ups = _uploads()
    ledger = Ledger(LedgerConfig(delta=1e-5))
    params = {"target_survivors": FLOOR} if protocol == "lightsecagg" else {}  # U = the floor: 40% may drop
    cfg = SecureAggregationConfig(protocol=protocol, colluders=colluders, protocol_params=params, distributed_dp=DistributedDPConfig(
        l2_clip=1.0, noise_multiplier=1.0, expected_clients=N, min_clients=FLOOR, bits=20, exact_noise=exact,
        mechanism=mechanism))
    view = SecureAggregator(cfg, ledger=ledger).aggregate(round=3, uploads=ups, drop_at=drop_at)
    survivors = sorted(view.contributors)
    err = (view.mean("a") - np.mean([xs[c] for c in survivors], axis=0)) * len(survivors)
    return float(err.var()), len(survivors), ledger


# Tolerance: a variance estimated from 8,192 coordinates has relative stddev sqrt(2 / 8192) = 1.6%; 0.07 is
# 4.5 of them, while one layer too many removed leaves 0.86-0.9x the target and none removed 1.17-1.67x.
@pytest.mark.parametrize("protocol", ["secagg+", "lightsecagg"])
@pytest.mark.parametrize("dropout", [0.0, 0.1, 0.2, 0.3, 0.4])
def test_the_released_noise_is_the_target_at_every_dropout_rate(dropout, protocol):
    dropped = set(range(1, round(dropout * N) + 1))
    drop_at = {"masked" if protocol != "lightsecagg" else "masked_input": dropped} if dropped else None
    ratio, survivors, ledger = _noise_ratio(exact=True, drop_at=drop_at, protocol=protocol)
    assert survivors == N - len(dropped)
    assert ratio == pytest.approx(1.0, abs=0.07)
    (record,) = ledger.noise_records()
    assert record["realised_variance"] == pytest.approx(record["target_variance"])
    assert record["planned_variance"] == pytest.approx(record["target_variance"] * survivors / FLOOR)
    if survivors > FLOOR + 1:  # the floor-sized noise it replaces is measurably larger
        floor_sized, _, _ = _noise_ratio(exact=False, drop_at=drop_at, protocol=protocol)
        assert floor_sized == pytest.approx(survivors / FLOOR, rel=0.07)


@pytest.mark.parametrize("protocol, drop_at", [
    ("secagg", {"unmask": {1, 2}}), ("secagg+", {"unmask": {1, 2}}), ("secagg+", {"masked": {3}, "unmask": {1}}),
    ("secagg+", {"consistency": {4}}), ("lightsecagg", {"recovery": {1, 2}}),
    ("lightsecagg", {"masked_input": {3}, "recovery": {1}}),
])
def test_survivors_that_drop_during_the_removal_are_removed_from_their_shares(protocol, drop_at):
    ratio, survivors, ledger = _noise_ratio(exact=True, drop_at=drop_at, protocol=protocol)
    dropped_before = drop_at.get("masked", set()) | drop_at.get("masked_input", set())
    assert survivors == N - len(dropped_before)  # the removal dropouts' inputs stay in the sum
    assert ratio == pytest.approx(1.0, abs=0.07)


def test_with_colluders_the_honest_survivors_carry_the_target():
    ratio, survivors, ledger = _noise_ratio(exact=True, drop_at=None, colluders=1)
    (record,) = ledger.noise_records()
    assert record["colluders"] == 1 and record["layer_index"] == N - 1 - FLOOR - 1
    # all N survivors keep V / (N - 1) each: the honest N - 1 hold exactly V
    assert ratio == pytest.approx(N / (N - 1), abs=0.07)


def test_the_ledger_records_the_noise_and_recompute_checks_it(tmp_path):
    _, _, ledger = _noise_ratio(exact=True, drop_at={"masked": {1, 2}})
    path = tmp_path / "ledger.json"
    ledger.write(path)
    assert recompute.main([str(path)]) == 0
    doc = json.loads(path.read_text())
    doc["noise"][0]["layer_index"] += 1  # one layer more removed than the survivors warrant
    path.write_text(json.dumps(doc))
    check = recompute.check_document(doc)
    assert check.noise_records == 1 and any("below the accounted" in m for m in check.mismatches)


def test_a_release_below_the_target_is_refused_before_any_charge():
    cfg = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=N, min_clients=FLOOR, exact_noise=True)
    from dp.distributed import DistributedDPEncoder

    enc = DistributedDPEncoder.from_config(cfg, dim=16)
    spec = cfg.layer_spec()
    too_much = enc.noise_record(spec=spec, survivors=8, index=spec.reveal_index(8) + 1)
    ledger = Ledger()
    with pytest.raises(InsufficientNoiseError, match="below the accounted"):
        enc.release(np.zeros(enc.length, np.uint32), round_seed=1, round_id=1, contributors=range(1, 9),
                    ledger=ledger, noise=too_much)
    assert ledger.clients() == [] and ledger.noise_records() == []


def test_exact_noise_is_refused_where_it_is_not_implemented():
    for bad in (0, 4097, True, 2.0):
        with pytest.raises(ValueError, match="dg_units"):
            DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, mechanism="discrete_gaussian", exact_noise=True,
                                dg_units=bad)
    ddp = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=8, min_clients=6, exact_noise=True)
    with pytest.raises(ValueError, match="plain"):
        SecureAggregationConfig(protocol="plain", distributed_dp=ddp)


def test_a_client_reveals_by_its_own_spec_not_by_the_servers():
    spec = LayerSpec(count=4, floor=3)
    server = SecAggServer(round_id=1, clients=[1, 2, 3, 4, 5], length=4, min_clients=3,
                          noise_layers=LayerSpec(count=3, floor=3))  # the server announces another layer count
    client = SecAggClient(client_id=1, round_id=1, input_fn=lambda: np.zeros(4, np.uint32),
                          noise_layers=LayerSecrets.fresh(spec))
    request = server.start()[1]
    with pytest.raises(ProtocolError, match="noise layers"):
        client.handle(request)


def test_layer_noise_is_drawn_from_its_key_and_sums_to_the_client_variance():
    noise = LayeredNoise(spec=LayerSpec(count=5, floor=4), target_variance=4.0e4)
    secrets = LayerSecrets.fresh(noise.spec)
    from dp.samplers import CryptoRandom

    total = noise.client_noise(secrets, client=7, dim=20_000, rng=CryptoRandom())
    assert total.var() == pytest.approx(noise.client_variance(), rel=0.05)
    removed = noise.removed({7: secrets.secrets[2]}, 2, dim=20_000)
    kept = total - removed
    assert kept.var() == pytest.approx(noise.remaining_variance(2), rel=0.05)
    assert math.isclose(noise.remaining_variance(2) * 7, 4.0e4)


@pytest.mark.parametrize("protocol", ["secagg", "lightsecagg"])
def test_a_lie_in_the_layer_shares_is_corrected_and_its_sender_named(protocol):
    from secagg.messages import Message
    from secagg.protocols.base import WrappedClient
    from secagg.protocols.lightsecagg import LightSecAggClient, LightSecAggServer
    from secagg.simulate import run_round

    class Liar(WrappedClient):
        def handle(self, msg):
            reply = self.inner.handle(msg)
            if reply is not None and "layer_shares" in reply.fields and reply["layer_shares"]:
                shares = dict(reply["layer_shares"])
                owner = min(shares)
                shares[owner] = shamir.to_bytes((shamir.from_bytes(shares[owner]) + 1) % shamir.PRIME)
                reply = Message(kind=reply.kind, round=reply.round, sender=reply.sender, receiver=reply.receiver,
                                fields={**reply.fields, "layer_shares": shares})
            return reply

    spec = LayerSpec(count=4, floor=4)
    secrets = {c: LayerSecrets.fresh(spec) for c in range(1, 9)}
    if protocol == "secagg":
        server = SecAggServer(round_id=1, clients=sorted(secrets), length=8, min_clients=4, noise_layers=spec)
        make = lambda c: SecAggClient(client_id=c, round_id=1, input_fn=lambda: np.zeros(8, np.uint32),
                                      noise_layers=secrets[c])
    else:
        server = LightSecAggServer(round_id=1, clients=sorted(secrets), length=8, target_survivors=5, privacy=2,
                                   noise_layers=spec)
        make = lambda c: LightSecAggClient(client_id=c, round_id=1, input_fn=lambda: np.zeros(8, np.uint32),
                                           noise_layers=secrets[c])
    clients = {c: make(c) for c in secrets}
    clients[3] = Liar(clients[3])
    result = run_round(server, clients)
    index = spec.reveal_index(8)
    assert result.layer_index == index == 3
    assert result.layer_secrets == {c: s.secrets[index] for c, s in secrets.items()}
    assert 3 in result.faulty and "layer" in result.faulty[3]


@pytest.mark.parametrize("protocol", ["secagg+", "lightsecagg"])
def test_survivors_send_their_own_excess_and_only_removal_dropouts_are_rebuilt_from_shares(protocol):
    import dataclasses

    from secagg.protocols.lightsecagg import LightSecAggClient, LightSecAggServer
    from secagg.protocols.secagg import SecAggPlusClient, SecAggPlusServer
    from secagg.ring import FIELD_P31, RING_2_32
    from secagg.simulate import run_round

    spec = LayerSpec(count=4, floor=4)
    ring = RING_2_32 if protocol == "secagg+" else FIELD_P31
    own = lambda c: (lambda index: np.full(8, 1000 * c + index, dtype=np.uint32))  # stands in for the DP layer
    secrets = {c: dataclasses.replace(LayerSecrets.fresh(spec), excess=own(c)) for c in range(1, 9)}
    if protocol == "secagg+":
        server = SecAggPlusServer(round_id=1, clients=sorted(secrets), length=8, min_clients=4, noise_layers=spec)
        make = lambda c: SecAggPlusClient(client_id=c, round_id=1, input_fn=lambda: np.zeros(8, np.uint32),
                                          noise_layers=secrets[c])
        last = "unmask"
    else:
        server = LightSecAggServer(round_id=1, clients=sorted(secrets), length=8, target_survivors=5, privacy=2,
                                   noise_layers=spec)
        make = lambda c: LightSecAggClient(client_id=c, round_id=1, input_fn=lambda: np.zeros(8, np.uint32),
                                           noise_layers=secrets[c])
        last = "recovery"
    result = run_round(server, {c: make(c) for c in secrets}, drop_at={last: {2, 5}})
    index = result.layer_index
    assert index == 3 and result.contributors == frozenset(secrets)
    assert result.layer_secrets == {c: secrets[c].secrets[index] for c in (2, 5)}  # only the removal dropouts
    expected = np.zeros(8, np.uint32)
    for c in set(secrets) - {2, 5}:
        ring.add_(expected, own(c)(index))
    np.testing.assert_array_equal(result.layer_excess, expected)


def test_recompute_counts_the_noise_records_of_every_file(tmp_path, capsys):
    _, _, ledger = _noise_ratio(exact=True, drop_at=None)
    paths = [ledger.write(tmp_path / f"ledger{i}.json") for i in range(2)]
    assert recompute.main([str(p) for p in paths]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("noise_records=2 mismatches=0")


@pytest.mark.parametrize("ring", ["z2^32", "f_p"])
def test_a_clients_own_excess_is_its_layers_up_to_the_index_at_every_index(ring):
    """`ClientExcess` keeps only the sum of all layers from encoding and answers a lower index by
    subtracting the layers above it (or redrawing those below): every index must equal layers 0..index
    redrawn from their keys, as the server would regenerate them, mod the ring."""
    import dataclasses

    from dp.distributed import DistributedDPEncoder
    from secagg.ring import FIELD_P31, RING_2_32

    cfg = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=12, min_clients=5, exact_noise=True)
    encoder = DistributedDPEncoder.from_config(cfg, dim=64, ring=RING_2_32 if ring == "z2^32" else FIELD_P31)
    spec = LayerSpec(count=7, floor=5)
    secrets = LayerSecrets.fresh(spec)
    layered, dim = encoder.plan.layered(spec), encoder.plan.padded_dim
    for index in [-1, *range(spec.count)]:
        excess = encoder.excess_fn(secrets, client=3)
        encoder.encode(np.zeros(64), round_seed=1, noise_layers=dataclasses.replace(secrets, excess=excess), client=3)
        got = excess(index)
        if index < 0:
            assert got.shape == (0,)
            continue
        want = encoder._reduce(layered.removed({3: secrets.secrets[index]}, index, dim=dim))
        np.testing.assert_array_equal(got, want)
        # without an encoding first (nothing kept) the layers are redrawn from the bottom: the same
        np.testing.assert_array_equal(encoder.excess_fn(secrets, client=3)(index), want)
    with pytest.raises(ValueError, match="past"):
        encoder.excess_fn(secrets, client=3)(spec.count)


# ---- the discrete Gaussian in equal-width units ------------------------------------------------------

@given(floor=st.integers(1, 40), count=st.integers(0, 40), colluders=st.integers(0, 5), extra=st.integers(0, 120),
       units=st.integers(1, 64))
@settings(max_examples=300, deadline=None)
def test_discrete_gaussian_units_leave_at_least_the_target_and_within_one_unit_per_survivor(floor, count, colluders,
                                                                                           extra, units):
    noise = LayeredNoise(spec=LayerSpec(count=count, floor=floor, colluders=colluders), target_variance=7.0,
                         units=units)
    assert noise.client_variance() == pytest.approx(7.0 / floor, rel=1e-12)  # G units at the floor, as charged
    assert noise.unit_count(noise.most_survivors) + sum(noise.layer_units(j) for j in range(count)) == units
    assert all(noise.layer_units(j) >= 0 for j in range(count))
    survivors = colluders + floor + extra
    honest = survivors - colluders
    index = noise.spec.reveal_index(survivors)
    record = noise.record(survivors=survivors, index=index)
    kept = noise.unit_count(floor + index + 1)  # units each honest survivor keeps
    assert record.realised_variance == pytest.approx(honest * kept * 7.0 / (floor * units), rel=1e-12)
    assert record.realised_variance >= 7.0 * (1 - 1e-12)
    if extra <= count:  # the layers reach this count: within one unit per survivor of the target
        assert record.realised_variance < 7.0 * (1 + honest / (floor * units)) + 1e-9
    assert recompute.realised_variance(record.to_dict()) == pytest.approx(record.realised_variance, rel=1e-12)
    if index + 1 < count:  # one layer more than the survivors warrant is flagged
        assert recompute.realised_variance({**record.to_dict(), "layer_index": index + 1}) == 0.0


@pytest.mark.parametrize("protocol, dropout", [("secagg+", 0.0), ("secagg+", 0.2), ("secagg+", 0.4),
                                               ("lightsecagg", 0.1), ("lightsecagg", 0.3)])
def test_exact_discrete_gaussian_noise_is_the_target_to_a_unit_at_every_dropout_rate(protocol, dropout):
    dropped = set(range(1, round(dropout * N) + 1))
    drop_at = {"masked" if protocol != "lightsecagg" else "masked_input": dropped} if dropped else None
    ratio, survivors, ledger = _noise_ratio(exact=True, drop_at=drop_at, protocol=protocol, mechanism="discrete_gaussian")
    (record,) = ledger.noise_records()
    expected = record["realised_variance"] / record["target_variance"]
    assert record["units"] == 16 and 1.0 <= expected < 1 + survivors / (FLOOR * 16)
    assert ratio == pytest.approx(expected, abs=0.07)
    if survivors > FLOOR + 1:  # floor-sized discrete Gaussian noise is measurably larger
        floor_sized, _, _ = _noise_ratio(exact=False, drop_at=drop_at, protocol=protocol, mechanism="discrete_gaussian")
        assert floor_sized == pytest.approx(survivors / FLOOR, rel=0.07)


@pytest.mark.parametrize("protocol, drop_at", [("secagg+", {"unmask": {1, 2}}), ("lightsecagg", {"recovery": {1, 2}})])
def test_discrete_gaussian_survivors_dropping_during_the_removal_are_removed_from_their_shares(protocol, drop_at):
    ratio, survivors, ledger = _noise_ratio(exact=True, drop_at=drop_at, protocol=protocol, mechanism="discrete_gaussian")
    (record,) = ledger.noise_records()
    assert survivors == N and ratio == pytest.approx(record["realised_variance"] / record["target_variance"], abs=0.07)


def test_the_discrete_gaussian_ledger_charges_the_floors_units_and_recompute_checks_them(tmp_path):
    _, _, ledger = _noise_ratio(exact=True, drop_at={"masked": {1, 2}}, mechanism="discrete_gaussian")
    path = tmp_path / "ledger.json"
    ledger.write(path)
    assert recompute.main([str(path)]) == 0
    doc = json.loads(path.read_text())
    charged = {e["mechanism"]["n_clients"] for a in doc["clients"].values() for e in a["entries"]}
    assert charged == {FLOOR * 16}  # n_min G units, whatever survived
    doc["noise"][0]["layer_index"] += 1
    assert any("below the accounted" in m for m in recompute.check_document(doc).mismatches)
    doc = json.loads(path.read_text())
    for a in doc["clients"].values():
        for e in a["entries"]:
            e["mechanism"]["n_clients"] = FLOOR * 8  # a charge for half the units the noise record claims
    assert any("differs from the charged" in m for m in recompute.check_document(doc).mismatches)


def test_a_plan_whose_units_are_too_narrow_for_the_tau_term_is_refused():
    from dp.distributed import PlanningError, plan_distributed_dp

    ok = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=N, min_clients=FLOOR, bits=20,
                             mechanism="discrete_gaussian", exact_noise=True)
    plan = plan_distributed_dp(ok, dim=64)
    assert plan.units == 16 and plan.unit_stddev_scaled == pytest.approx(plan.local_stddev_scaled / 4)
    narrow = DistributedDPConfig(l2_clip=1.0, noise_multiplier=0.05, expected_clients=N, min_clients=FLOOR, bits=8,
                                 mechanism="discrete_gaussian", exact_noise=True, dg_units=4096)
    with pytest.raises(PlanningError, match="too narrow for the tau term"):
        plan_distributed_dp(narrow, dim=64)
