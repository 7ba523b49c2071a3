"""Keep Hugging Face libraries offline: weights and data come from installed packages, never a hub.

Nothing happens on import: programs call `ensure_offline()` first thing (the examples' ``main``,
the deployment CLI); the test suite sets the same variables in its conftest. Loading itself never
downloads either way (`nlp_models.backbone` passes ``local_files_only=True``).
"""
from __future__ import annotations

import os
import sys

_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = ("1", "ON", "YES", "TRUE")


def ensure_offline() -> None:
    """Set the offline variables (without overriding an explicit user choice) and quiet tokenizers' fork warning.

    huggingface_hub reads HF_HUB_OFFLINE once, on import; if it is already imported, its flag is
    updated too, so calling this after ``import transformers`` still takes effect.
    """
    for name in _OFFLINE_VARIABLES:
        os.environ.setdefault(name, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None and os.environ["HF_HUB_OFFLINE"].upper() in _TRUE:
        constants.HF_HUB_OFFLINE = True
