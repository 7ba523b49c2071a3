import json

import numpy as np
import pytest

from dp.leakage.token_recovery import recover_from_transcript, score_tokens
from dp.leakage.transcript import Transcript, TranscriptFull
from fl_algorithms.api import Masked, Upload
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator


def _filled() -> Transcript:
    tr = Transcript(protocol="secagg+")
    tr.record_cohort(1, [3, 1, 2])
    tr.record_aggregate(1, "emb", np.arange(6.0), contributors=[1, 2], total_weight=5.0)
    tr.record_aggregate(1, "head", np.ones(2), contributors=[1, 2], total_weight=5.0)
    tr.record_individual(2, 4, "emb", np.full(6, 2.0))
    tr.record_individual(2, 5, "emb", np.full(6, 3.0))
    tr.record_released(2, "sketch", 4, np.array([0.5, -0.5]), {"unit": "client", "sigma": 1.5})
    return tr


def test_records_what_the_server_saw():
    tr = _filled()
    assert tr.rounds == [1, 2]
    assert tr.cohort(1) == (1, 2, 3)
    rec = tr.aggregate(1, "emb")
    assert rec.contributors == (1, 2) and rec.total_weight == 5.0
    assert np.array_equal(rec.weighted_sum, 5.0 * np.arange(6.0))
    assert tr.contributors(1) == (1, 2) and tr.contributors(2) == (4, 5)
    assert set(tr.individuals(2, "emb")) == {4, 5}
    assert tr.released(2, "sketch")[4].meta["sigma"] == 1.5
    assert tr.parts() == ["emb", "head"] and tr.parts(2) == ["emb"]
    assert tr.nbytes == (6 + 2 + 6 + 6 + 2) * 8
    with pytest.raises(ValueError, match="read-only"):
        rec.mean[0] = 1.0  # read-only


def test_save_load_roundtrip_without_pickle(tmp_path):
    tr = _filled()
    npz, js = tr.save(tmp_path / "run" / "transcript")
    assert npz.name == "transcript.npz" and js.name == "transcript.json"
    with np.load(npz, allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
    back = Transcript.load(tmp_path / "run" / "transcript")
    assert back.rounds == tr.rounds and back.protocol == "secagg+" and back.cohort(1) == (1, 2, 3)
    assert np.array_equal(back.aggregate(1, "emb").mean, tr.aggregate(1, "emb").mean)
    assert back.aggregate(1, "head").contributors == (1, 2)
    assert np.array_equal(back.individuals(2, "emb")[5], np.full(6, 3.0))
    assert back.released(2, "sketch")[4].meta == {"unit": "client", "sigma": 1.5}
    assert back.nbytes == tr.nbytes


def test_load_rejects_foreign_files(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"format": "something-else"}))
    np.savez(tmp_path / "x.npz")
    with pytest.raises(ValueError, match="not a server transcript"):
        Transcript.load(tmp_path / "x")


def test_only_named_parts_and_ranges_are_recorded(tmp_path):
    tr = Transcript(protocol="plain", parts={"emb": (4, 10), "head": None}, dtype="float32")
    assert tr.wants("emb") and not tr.wants("body")
    tr.record_individual(1, 1, "body", np.ones(1000))  # silently skipped
    tr.record_individual(1, 1, "emb", np.arange(20.0))
    tr.record_aggregate(2, "head", np.ones(3), contributors=[1], total_weight=1.0)
    assert tr.parts() == ["emb", "head"]
    assert tr.individuals(1, "emb")[1].tolist() == list(range(4, 10))
    assert tr.individuals(1, "emb")[1].dtype == np.float32
    assert tr.individual_offset(1, "emb") == 4
    assert tr.nbytes == (6 + 3) * 4
    tr.save(tmp_path / "t")
    back = Transcript.load(tmp_path / "t")
    assert back.individuals(1, "emb")[1].tolist() == list(range(4, 10)) and back.individual_offset(1, "emb") == 4
    with pytest.raises(ValueError, match="exceeds"):
        tr.record_individual(3, 1, "emb", np.ones(8))


def test_max_bytes_fails_loudly_and_keeps_state():
    tr = Transcript(protocol="plain", max_bytes=100)
    tr.record_individual(1, 1, "p", np.ones(10))  # 80 bytes
    with pytest.raises(TranscriptFull, match="would exceed the transcript limit of 100 bytes"):
        tr.record_individual(1, 2, "p", np.ones(10))
    assert set(tr.individuals(1, "p")) == {1} and tr.nbytes == 80


def test_validation():
    tr = Transcript(protocol="plain")
    with pytest.raises(ValueError, match="round must be a non-negative int"):
        tr.record_individual(True, 1, "p", np.ones(2))
    with pytest.raises(ValueError, match="client ids are ints"):
        tr.record_individual(1, "a", "p", np.ones(2))
    with pytest.raises(ValueError, match="NaN"):
        tr.record_individual(1, 1, "p", np.array([np.nan]))
    with pytest.raises(ValueError, match="numeric"):
        tr.record_individual(1, 1, "p", np.array(["x"]))
    with pytest.raises(ValueError, match="total_weight"):
        tr.record_aggregate(1, "p", np.ones(2), contributors=[1], total_weight=0.0)
    with pytest.raises(ValueError, match="contributor"):
        tr.record_aggregate(1, "p", np.ones(2), contributors=[], total_weight=1.0)
    tr.record_aggregate(1, "p", np.ones(2), contributors=[1], total_weight=1.0)
    with pytest.raises(ValueError, match="already"):
        tr.record_aggregate(1, "p", np.ones(2), contributors=[1], total_weight=1.0)
    with pytest.raises(TypeError, match="not JSON serializable"):
        tr.record_released(1, "r", 1, np.ones(1), {"bad": object()})
    with pytest.raises(TypeError, match="parts must be a sequence of names, not one string"):
        Transcript(protocol="plain", parts="emb")
    with pytest.raises(ValueError, match=r"invalid range \(5, 2\) for part 'emb'"):
        Transcript(protocol="plain", parts={"emb": (5, 2)})


@pytest.mark.parametrize("protocol", ["plain", "secagg+"])
def test_records_a_real_aggregate_view_and_the_union_leaks(ten_client_updates, bag, protocol):
    """The server's actual view: a decoded secure mean still reveals the cohort's token union."""
    updates, clients = ten_client_updates
    agg = SecureAggregator(SecureAggregationConfig(protocol=protocol, clip=0.25, max_weight=1.0, max_clients=16))
    uploads = {c: Upload(masked={"emb": Masked(u, weight=1.0), "head": Masked(np.zeros(4), weight=1.0)})
               for c, u in updates.items()}
    view = agg.aggregate(round=7, uploads=uploads)
    tr = Transcript(protocol=protocol, parts=["emb"])
    tr.record_view(view, cohort=clients)
    assert tr.parts() == ["emb"] and tr.cohort(7) == tuple(range(1, 11))
    rec = tr.aggregate(7, "emb")
    assert rec.contributors == tuple(range(1, 11))
    assert np.abs(rec.mean - sum(updates.values()) / 10).max() <= view.groups["emb"].error_bound + 1e-12
    sums, individual = recover_from_transcript(tr, part="emb", shape=bag.shape, method="support")
    assert not individual
    union = frozenset().union(*(d.token_set for d in clients.values()))
    assert score_tokens(sums[7], union).f1 == 1.0
