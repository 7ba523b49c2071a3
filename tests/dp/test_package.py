"""dp/__init__.py: every name the package exports resolves to its module's object, and importing a
light submodule such as dp.sampling (which the round engine imports) loads no accounting library."""
import importlib
import subprocess
import sys

import pytest

import dp


@pytest.mark.parametrize("name", dp.__all__)
def test_every_exported_name_is_its_modules_object(name):
    assert getattr(dp, name) is getattr(importlib.import_module(dp._MODULE_OF[name]), name)
    assert name in dir(dp)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Ledgr'"):
        dp.Ledgr  # noqa: B018


def test_importing_dp_sampling_loads_neither_dp_accounting_nor_scipy_stats():
    code = ("import sys, dp.sampling; "
            "print(sorted(m for m in ('dp_accounting', 'scipy.stats', 'dp.ledger') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_boundary_delta_still_reads_the_binomial_pmf():
    from scipy import stats

    from dp.sampling import SamplingRecord

    record = SamplingRecord("poisson", 100, 0.1, 5)
    assert record.boundary_delta == pytest.approx(float(stats.binom.pmf(4, 99, 0.1)))
