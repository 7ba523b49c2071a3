"""The suite's own rule on skips: under `make test` a package `make install` provides is required."""
import pytest

from tests import requirements


def test_a_package_make_install_provides_is_required_under_make_test(monkeypatch):
    monkeypatch.setattr(requirements, "INSTALLED_BY_MAKE", requirements.INSTALLED_BY_MAKE | {"no_such_pkg_zz"})
    monkeypatch.setenv("FEDSECURE_REQUIRE_INSTALLED", "1")
    with pytest.raises(ModuleNotFoundError, match="no_such_pkg_zz"):
        requirements.strict_importorskip("no_such_pkg_zz", reason="shipped by make install")
    with pytest.raises(ImportError, match="make install"):
        requirements.require_data("no_such_pkg_zz", reason="data")
    with pytest.raises(pytest.skip.Exception, match="optional"):  # an optional extra still skips
        requirements.strict_importorskip("another_missing_pkg_zz", reason="optional extra")


def test_outside_make_test_a_missing_package_skips_with_its_reason(monkeypatch):
    monkeypatch.setattr(requirements, "INSTALLED_BY_MAKE", requirements.INSTALLED_BY_MAKE | {"no_such_pkg_zz"})
    monkeypatch.delenv("FEDSECURE_REQUIRE_INSTALLED", raising=False)
    with pytest.raises(pytest.skip.Exception, match="shipped by make install"):
        requirements.strict_importorskip("no_such_pkg_zz", reason="shipped by make install")
    with pytest.raises(pytest.skip.Exception, match="data"):
        requirements.require_data("no_such_pkg_zz", reason="data")


def test_conftest_installs_the_strict_importorskip():
    assert pytest.importorskip is requirements.strict_importorskip
