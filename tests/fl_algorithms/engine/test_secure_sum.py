import numpy as np
import pytest

from dp.distributed import DistributedDPConfig
from dp.leakage.transcript import Transcript
from dp.ledger import Ledger, LedgerConfig, Observer, PrivacyUnit
from dp.released import Released
from fl_algorithms.api import Masked, Upload
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator


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
    SecureAggregator(SecureAggregationConfig(protocol="plain", clip=1.0, max_weight=1.0, max_clients=8),
                     transcript=plain_tr).aggregate(round=1, uploads=ups)
    SecureAggregator(SecureAggregationConfig(protocol="secagg+", clip=1.0, max_weight=1.0, max_clients=8),
                     transcript=secure_tr).aggregate(round=1, uploads=ups)
    assert set(plain_tr.individuals(1, "a")) == {1, 2, 3, 4}
    np.testing.assert_allclose(plain_tr.individuals(1, "a")[2], xs[2][:30], atol=1e-6)
    assert not secure_tr.individuals(1, "a")
    np.testing.assert_allclose(secure_tr.aggregate(1, "a").mean, np.mean([x[:30] for x in xs.values()], axis=0), atol=1e-6)
