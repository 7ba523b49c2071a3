"""Suite-wide settings: offline Hugging Face, few threads, and a modest hypothesis profile."""
import os

for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

import torch  # noqa: E402

# Two cores and many tiny models: one intra-op thread is faster and keeps tests independent of load.
torch.set_num_threads(1)
