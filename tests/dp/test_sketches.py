"""DP JL sketches: the privacy unit decides usefulness; useless releases are refused with numbers."""
import numpy as np
import pytest

from dp.ledger import Ledger
from dp.sketches import DPSketcher, SketchConfig, SketchRefused, cosine_noise_std, projection_matrix

DIM = 384


def docs_around(center: np.ndarray, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return center + 0.3 * rng.normal(size=(n, center.shape[0])) / np.sqrt(center.shape[0])


def test_client_level_sketch_at_epsilon_8_is_refused_with_the_numbers():
    sketcher = DPSketcher(SketchConfig(epsilon=8.0, unit="client", sketch_dim=64), dim=DIM)
    ledger = Ledger()
    with pytest.raises(SketchRefused, match=r"client-level.*epsilon=8.*noise std would be (\d+\.\d+)") as info:
        sketcher.release(client_id=1, ledger=ledger, summary=np.ones(DIM) / np.sqrt(DIM))
    std = float(str(info.value).split("would be ")[1].split()[0])
    assert 10 < std < 14  # the research note's ~12
    assert ledger.clients() == []  # nothing charged, nothing released


def test_example_level_sketch_of_1000_documents_is_useful():
    sketcher = DPSketcher(SketchConfig(epsilon=8.0, unit="example", sketch_dim=64), dim=DIM)
    plan = sketcher.plan(n_documents=1000)
    assert plan.cosine_noise_std < 0.01
    assert plan.sensitivity == pytest.approx(2 * sketcher.operator_norm / 1000)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=DIM), rng.normal(size=DIM)
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    ledger = Ledger()
    r1 = sketcher.release(client_id=1, ledger=ledger, documents=docs_around(a, 1000, 1))
    r2 = sketcher.release(client_id=2, ledger=ledger, documents=docs_around(a, 1000, 2))
    r3 = sketcher.release(client_id=3, ledger=ledger, documents=docs_around(b, 1000, 3))

    def cos(u, v):
        return float(u @ v / np.linalg.norm(u) / np.linalg.norm(v))

    assert cos(r1.payload, r2.payload) > 0.9 > 0.5 > abs(cos(r1.payload, r3.payload))
    assert r1.unit.value == "example" and r1.mechanism["n_documents"] == 1000
    eps = ledger.epsilon(1, unit="example", observer="server")
    assert 8.0 < eps < 16.0  # RDP conversion of the analytic-Gaussian noise is looser than 8


def test_example_level_needs_documents_and_few_documents_are_refused():
    sketcher = DPSketcher(SketchConfig(epsilon=1.0, unit="example", sketch_dim=64), dim=DIM)
    with pytest.raises(ValueError, match="documents"):
        sketcher.release(client_id=1, ledger=Ledger(), summary=np.ones(DIM))
    with pytest.raises(SketchRefused, match="refusing the example-level sketch.*useless for similarity"):
        sketcher.release(client_id=1, ledger=Ledger(), documents=np.ones((3, DIM)))


def test_projection_is_public_and_deterministic():
    p = projection_matrix(seed=5, sketch_dim=16, dim=50)
    assert np.array_equal(p, projection_matrix(seed=5, sketch_dim=16, dim=50))
    assert not np.array_equal(p, projection_matrix(seed=6, sketch_dim=16, dim=50))
    assert p.std() == pytest.approx(1 / 4, rel=0.1)
    assert cosine_noise_std(sigma=1.2, sketch_dim=64, clip=1.0) == pytest.approx((2 * 1.2**2 + 64 * 1.2**4) ** 0.5)
