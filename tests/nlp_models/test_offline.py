"""Offline Hugging Face: nothing happens on import; `ensure_offline()` sets it up explicitly."""
import os
import subprocess
import sys

from nlp_models._offline import ensure_offline

_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM")


def _run(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in _VARIABLES}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


def test_importing_the_models_sets_no_environment_variable():
    out = _run("import os, nlp_models.backbone, nlp_models.frozen_prefix, nlp_models._offline; "
               f"print([v for v in {_VARIABLES!r} if v in os.environ])")
    assert out == "[]"


def test_ensure_offline_sets_the_variables_and_the_hub_flag_after_import():
    out = _run("import os, huggingface_hub.constants as c; from nlp_models._offline import ensure_offline; "
               "before = c.HF_HUB_OFFLINE; ensure_offline(); "
               "print(before, c.HF_HUB_OFFLINE, os.environ['TRANSFORMERS_OFFLINE'], os.environ['TOKENIZERS_PARALLELISM'])")
    assert out == "False True 1 false"
    # an explicit user choice is kept
    assert _run("import os, huggingface_hub.constants as c; from nlp_models._offline import ensure_offline; "
                "ensure_offline(); print(os.environ['HF_HUB_OFFLINE'], c.HF_HUB_OFFLINE)", HF_HUB_OFFLINE="0") == "0 False"


def test_ensure_offline_is_idempotent_in_process():
    ensure_offline()
    ensure_offline()
    assert all(v in os.environ for v in _VARIABLES)
