"""Force Hugging Face libraries offline: weights and data come from installed packages, never a hub."""
from __future__ import annotations

import os

_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def ensure_offline() -> None:
    """Set the offline variables (without overriding an explicit user choice) and quiet tokenizers' fork warning."""
    for name in _OFFLINE_VARIABLES:
        os.environ.setdefault(name, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


ensure_offline()
