"""dp.audit.one_run: Steinke et al.'s one-run audit of the project's Opacus DP-SGD client with canary examples."""
import dp_accounting
import pytest
from dp_accounting import rdp

pytest.importorskip("opacus")

from dp.audit.one_run import DPSGDAuditConfig, audit_dpsgd  # noqa: E402


def test_a_correct_dpsgd_run_stays_under_its_ledger_claim():
    result = audit_dpsgd(DPSGDAuditConfig(canaries=1000, noise_multiplier=1.0, epochs=1, seed=1))
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        result.sample_rate, dp_accounting.GaussianDpEvent(1.0)), result.steps))
    assert result.claimed_epsilon == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-6)  # the ledger's claim
    assert result.one_run_lower_bound < result.claimed_epsilon and result.epsilon_lower_bound < result.claimed_epsilon
    assert not result.flagged and result.unit == "example"
    assert 400 < result.included < 600 and result.one_run.canaries == 1000  # fair coins


def test_with_almost_no_noise_the_canaries_give_themselves_away():
    result = audit_dpsgd(DPSGDAuditConfig(canaries=1000, noise_multiplier=0.05, epochs=2, seed=2))
    assert result.one_run_lower_bound > 2.5 and result.epsilon_lower_bound > 2.5
    assert result.one_run.correct == result.one_run.guesses  # every guess right


def test_the_config_refuses_nonsense():
    with pytest.raises(ValueError, match="must be positive"):
        DPSGDAuditConfig(noise_multiplier=0.0)
    with pytest.raises(ValueError, match="need canaries >= 2"):
        DPSGDAuditConfig(canaries=1)
