import pytest

from fl_algorithms.tasks.toy import toy_trainer


def make_trainers(n_clients: int = 4, *, seed: int = 0, **kw):
    return {c: toy_trainer(c, seed=seed, **kw) for c in range(1, n_clients + 1)}


@pytest.fixture
def toy_trainers():
    return make_trainers
