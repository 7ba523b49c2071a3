"""dp/audit/__init__.py: its names resolve lazily to their modules' objects, and importing it loads nothing heavy."""
import importlib
import subprocess
import sys

import pytest

import dp.audit


@pytest.mark.parametrize("name", dp.audit.__all__)
def test_every_exported_name_is_its_modules_object(name):
    assert getattr(dp.audit, name) is getattr(importlib.import_module(dp.audit._MODULE_OF[name]), name)
    assert name in dir(dp.audit)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'audits'"):
        dp.audit.audits  # noqa: B018


def test_importing_dp_audit_loads_no_accounting_or_torch():
    code = ("import sys, dp.audit; "
            "print(sorted(m for m in ('dp_accounting', 'scipy.stats', 'torch', 'dp.audit.bounds') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
