"""dp.audit.runner: canary clients as ordinary clients of SimulationRunner runs (secure aggregation, the
ledger, the round engine), audited from the global models alone."""
import math

import numpy as np
import pytest

from dp.audit.faults import FAULTS
from dp.audit.federated import CanaryDesign
from dp.audit.runner import CanaryTrainer, audit_run
from dp.distributed import DistributedDPConfig, plan_distributed_dp
from fl_algorithms.engine.secure_sum import SecureAggregationConfig

DESIGN = CanaryDesign(trials=4, canaries_per_trial=16, inclusion=0.5, held_out_per_trial=16, orthogonal=True,
                      canary_norm=4.0, seed=3)


def _secure(ddp=None):
    return SecureAggregationConfig(protocol="secagg+", clip=8.0, max_weight=1, max_clients=40, min_release_group=2,
                                   distributed_dp=ddp)


def test_secagg_without_noise_reaches_the_largest_bound_through_the_engine():
    result = audit_run(_secure(), design=DESIGN, dim=64, rounds=2, background_clients=2, delta=1e-5)
    assert result.claimed_epsilon == math.inf and result.empirical_epsilon == math.inf
    assert result.epsilon_lower_bound == pytest.approx(result.max_lower_bound) and result.max_lower_bound > 1


def test_ddp_through_the_engine_claims_the_plans_epsilon_and_hides_the_canaries():
    ddp = DistributedDPConfig(l2_clip=1.0, noise_multiplier=0.5, expected_clients=40, min_clients=2)
    result = audit_run(_secure(ddp), design=DESIGN, dim=64, rounds=2, background_clients=2, delta=0.1)
    plan = plan_distributed_dp(ddp, dim=64)
    assert result.claimed_epsilon == pytest.approx(plan.epsilon(observer="outsider", rounds=2, delta=0.1), rel=1e-6)
    assert result.epsilon_lower_bound < result.claimed_epsilon and not result.flagged
    with FAULTS["clipping_skipped"].patch():  # the same engine, its DDP clip gone: the canaries' 4 C show
        faulty = audit_run(_secure(ddp), design=DESIGN, dim=64, rounds=2, background_clients=2, delta=0.1)
    assert faulty.empirical_epsilon > 3 * result.empirical_epsilon
    # the inserted canaries' mean cosine rises (by about 6 standard errors of the mean at 40 canaries;
    # its size depends on the noise drawn, so only the direction is asserted)
    assert faulty.fits["final"].mean_in > result.fits["final"].mean_in


def test_a_canary_trainer_moves_the_model_by_its_update():
    t = CanaryTrainer(np.array([1.0, 2.0]))
    t.set_shared({"w": np.array([0.5, 0.5])})
    assert t.train(epochs=1) == {} and np.allclose(t.get_shared()["w"], [1.5, 2.5])
    with pytest.raises(KeyError, match="w"):
        t.set_shared({"v": np.zeros(2)})
