"""Suite-wide settings: offline Hugging Face, few threads, and a modest hypothesis profile."""
import os

for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if os.environ.get("FEDSECURE_MUTANT"):  # benchmarks/mutants.py: this whole run has one guarantee broken
    from tests.mutants import install_from_env

    install_from_env()

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

import torch  # noqa: E402

# Two cores and many tiny models: one intra-op thread is faster and keeps tests independent of load.
torch.set_num_threads(1)

import pytest  # noqa: E402

from tests.requirements import strict_importorskip  # noqa: E402

# Under `make test` (and so CI) a package that `make install` provides may not be skipped silently:
# its absence is a collection error there, and pytest prints every remaining skip's reason (-rs).
pytest.importorskip = strict_importorskip


@pytest.fixture
def empty_first_poisson_batch(monkeypatch):
    """Opacus' Poisson sampler serves an empty batch first, then its own draws: the case a DP-SGD loss must
    survive. Yields the list of batch sizes served, so a test can show the empty one was used."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    served: list[int] = []
    original = UniformWithReplacementSampler.__iter__

    def patched(self):
        for i, indices in enumerate(original(self)):
            indices = [] if i == 0 else indices
            served.append(len(indices))
            yield indices

    monkeypatch.setattr(UniformWithReplacementSampler, "__iter__", patched)
    return served


HEAVY_FIRST = (
    "tests/examples/test_fedmcp_secure.py", "tests/examples/test_privacy_frontier.py",
    "tests/examples/test_adafedselectkd.py", "tests/examples/test_atc_secure.py",
    "tests/fl_algorithms/experiments/test_atc_grid.py", "tests/examples/test_fednlp_classification.py",
    "tests/fl_algorithms/engine/test_deploy.py", "tests/benchmarks/test_mutants_quick.py",
    "tests/examples/test_fednlp_benchmark.py", "tests/dp/audit/test_selftest.py",
    "tests/examples/test_fedseit_continual.py", "tests/fl_algorithms/experiments/test_continual_grid.py",
    "tests/fl_algorithms/experiments/test_publish.py", "tests/fl_algorithms/engine/test_launch.py",
    "tests/dp/audit/test_faults.py",
)
"""The slowest files, longest first (seconds each on 2 cores, 2026-11-29: 100 down to 13). `make test` runs
two workers a file at a time; starting the long files first keeps one of them from running alone at the
end (longest-processing-time-first scheduling). Order only: every test still runs."""


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest as collected
