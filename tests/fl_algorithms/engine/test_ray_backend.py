"""The Ray backend: clients as Ray actors give the same run as the in-memory driver for the same seed,
their private state stays reachable through the driver's handles (checkpoints), and an Upload's Masked
parts never cross the process boundary."""
import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray backend is an optional extra (pip install -e '.[ray]')")

from fl_algorithms.algorithms.atc_assign import SecureAssign  # noqa: E402
from fl_algorithms.algorithms.fedavg import FedAvg  # noqa: E402
from fl_algorithms.engine.secure_sum import SecureAggregationConfig  # noqa: E402
from fl_algorithms.engine.sim import RunConfig, SimulationRunner  # noqa: E402
from fl_algorithms.tasks.toy import toy_trainer  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _run(algorithm, backend, *, clients=6, rounds=3):
    trainers = {c: toy_trainer(c, lr=0.2) for c in range(1, clients + 1)}
    # insecure_seed: stochastic rounding from a seed instead of the OS CSPRNG, so that two runs can be
    # compared bit for bit (never in a run whose privacy is reported)
    secure = SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100.0, max_clients=clients,
                                     min_release_group=3, insecure_seed=7)
    runner = SimulationRunner(algorithm=algorithm, trainers=trainers,
                              config=RunConfig(rounds=rounds, sampler="seeded", secure=secure, backend=backend))
    history = runner.run(progress=False)
    return runner, history


@pytest.mark.parametrize("make", [lambda: FedAvg(local_epochs=2),
                                  lambda: SecureAssign(clusters=2, sketch_dim=8, min_size=3, local_epochs=1, seed=1)])
def test_ray_gives_the_in_memory_run(make):
    memory, h_memory = _run(make(), "memory")
    remote, h_remote = _run(make(), "ray")
    try:
        flat = lambda state: {k: v for k, v in state.items() if isinstance(v, np.ndarray)}  # noqa: E731
        for key, value in flat(memory.state).items():
            assert np.array_equal(value, remote.state[key]), key
        for a, b in zip(h_memory, h_remote):
            assert a.metrics == b.metrics and a.sums == b.sums
        # each client's private state and checkpoint live in its actor and come back through the handle
        assert memory.clients[2].state.keys() == remote.clients[2].state.keys()
        blob = remote.state_dict()
        assert set(blob["clients"]) == set(memory.clients)
    finally:
        remote.close()


def test_the_backend_is_checked():
    with pytest.raises(ValueError, match="backend is 'memory' or 'ray', got 'dask'"):
        RunConfig(backend="dask")
    with pytest.raises(ValueError, match="ray_workers must be at least 1"):
        RunConfig(backend="ray", ray_workers=0)
