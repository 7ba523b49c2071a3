"""FedSeIT / FedWeIT / FedAvg(B) / Local continual on the round engine: schedule, SIT selection, FedSeIT
without SIT (every candidate), DP descriptors on the ledger, sealed relays (and what happens to forged
ones), consent, and the bytes each client counts."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dp.centroids import CentroidConfig, DPCentroids
from dp.ledger import Ledger
from fl_algorithms.algorithms.fedseit import (ContinualFedAvg, FedSeIT, FedWeIT, LocalContinual, Schedule,
                                              max_candidates, pack_adaptive, unpack_adaptive)
from fl_algorithms.api import ClientBroadcast, ClientContext, Relayed
from fl_algorithms.engine.peer_channel import PeerChannel, PeerDirectory
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.tasks.continual import TaskData
from fl_algorithms.training.continual_trainer import BASE_PART, ContinualTrainer, ContinualTrainerConfig
from nlp_models.backbone import load_tokenizer
from nlp_models.decomposed_cnn import DecomposedConfig

DIM = 16
WORDS = [("good great fine lovely", "bad awful poor dreadful"), ("city river mountain coast", "goal match team score"),
         ("market shares profit bank", "election party vote minister")]


def _task(name: str, words: tuple[str, str], seed: int) -> TaskData:
    rng = np.random.default_rng(seed)

    def docs(n):
        labels = np.arange(n) % 2
        texts = tuple(" ".join(rng.choice(words[y].split(), 6)) + f" doc {seed} {i}" for i, y in enumerate(labels))
        return texts, labels

    train, test = docs(40), docs(12)
    return TaskData(name=name, label_names=("a", "b"), train_texts=train[0], train_labels=train[1],
                    test_texts=test[0], test_labels=test[1])


@pytest.fixture(scope="module")
def world():
    tokenizer = load_tokenizer()
    embeddings = torch.randn(tokenizer.vocab_size, DIM, generator=torch.Generator().manual_seed(0))
    tasks = {c: [_task(f"t{(c + t) % 3}", WORDS[(c + t) % 3], 10 * c + t) for t in range(2)] for c in (1, 2, 3)}
    directory, keys = PeerDirectory.generate([1, 2, 3])
    return dict(tokenizer=tokenizer, embeddings=embeddings, tasks=tasks, peers=directory, keys=keys)


def _trainers(world, *, mode: str, slots: int):
    model = DecomposedConfig(filters=4, mode=mode, foreign_slots=slots, seed=3)
    return {c: ContinualTrainer(client_id=c, tasks=world["tasks"][c], tokenizer=world["tokenizer"],
                                embeddings=world["embeddings"], model=model,
                                config=ContinualTrainerConfig(lr=3e-3, batch_size=8, max_length=12),
                                keys=world["keys"][c]) for c in (1, 2, 3)}


def _descriptor():
    return DPCentroids(CentroidConfig(epsilon=8.0, centres=2, iterations=2, projection_dim=8, max_centroid_noise=5.0),
                       dim=DIM)


def _run(world, algorithm, trainers, schedule):
    secure = SecureAggregationConfig(protocol="secagg+", clip=1.0, max_weight=100.0, max_clients=3, min_release_group=3)
    ledger = Ledger()
    runner = SimulationRunner(algorithm=algorithm, trainers=trainers, ledger=ledger,
                              initial={BASE_PART: trainers[1].get_shared()[BASE_PART]},
                              config=RunConfig(rounds=schedule.rounds, sampler="seeded", secure=secure))
    return runner, runner.run(progress=False), ledger


def test_schedule():
    s = Schedule(tasks=3, rounds_per_task=3)
    assert [s.task_of(r) for r in range(1, 10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2] and s.rounds == 9
    assert [s.announced(r) for r in range(1, 10)] == [(0, 1), (), (), (2,), (), (), (), (), ()]
    assert s.is_last_round(6) and not s.is_last_round(5)
    with pytest.raises(ValueError, match="need tasks >= 1 and rounds_per_task >= 2"):
        Schedule(tasks=3, rounds_per_task=1)
    with pytest.raises(ValueError, match="rounds start at 1, got 0"):
        s.task_of(0)


def test_pack_unpack_is_exact_and_checks_size_first():
    shapes = {"conv3": (2, 3, 3), "conv4": (2, 3, 4)}
    adaptive = {n: torch.randn(*s) for n, s in shapes.items()}
    blob = pack_adaptive(7, adaptive, list(shapes))
    task, back = unpack_adaptive(blob, shapes)
    assert task == 7 and all(torch.equal(back[n], adaptive[n]) for n in shapes)
    for bad in (blob[:-4], blob + b"\x00" * 4, b"XXXX" + blob[4:]):
        with pytest.raises(ValueError, match="relayed adaptive has .* bytes, expected 176"):
            unpack_adaptive(bad, shapes)
    nan = dict(adaptive, conv3=torch.full((2, 3, 3), float("nan")))
    with pytest.raises(ValueError, match="not finite"):
        unpack_adaptive(pack_adaptive(1, nan, list(shapes)), shapes)


def test_sit_selection_rules():
    algorithm = FedSeIT(schedule=Schedule(tasks=3, rounds_per_task=2), top_k=2, descriptor=_descriptor(),
                        peers=PeerDirectory.generate([1, 2, 3])[0])
    e = np.eye(8)[:2]
    descriptors = {"1:0": e, "1:1": e, "1:2": e, "2:0": e, "2:1": -e, "3:0": 0.5 * e + 0.5 * np.eye(8)[2:4],
                   "3:2": e}
    chosen = algorithm.select(client=1, task=1, descriptors=descriptors, started=1, round=1)
    owners = [(int(o), int(u)) for o, u, _ in chosen]
    # own current (1:1) and future (1:2) tasks and tasks not started (3:2) are never candidates
    assert owners == [(1, 0), (2, 0)] and abs(sum(a for *_, a in chosen) - 1) < 1e-12
    assert (2, 1) not in owners                                       # anti-parallel: score 0, ranked last
    algorithm.consent = frozenset({1, 3})
    assert all(int(o) != 2 for o, _, _ in algorithm.select(client=1, task=1, descriptors=descriptors, started=1, round=1))
    algorithm.consent, algorithm.selection = None, "random"
    a = algorithm.select(client=1, task=1, descriptors=descriptors, started=1, round=4)
    assert a == algorithm.select(client=1, task=1, descriptors=descriptors, started=1, round=4)
    assert all((int(o), int(u)) not in {(1, 1), (1, 2), (3, 2)} for o, u, _ in a)


def test_fedseit_end_to_end(world):
    schedule = Schedule(tasks=2, rounds_per_task=3)
    trainers = _trainers(world, mode="fedseit", slots=2)
    algorithm = FedSeIT(schedule=schedule, top_k=2, local_epochs=1, descriptor=_descriptor(), peers=world["peers"],
                        run="t")
    runner, history, ledger = _run(world, algorithm, trainers, schedule)
    # every client announced both descriptors; the server's ledger holds them per observer, epsilon > 0
    for c in (1, 2, 3):
        keys = {e.summary_key for e in ledger.entries(c)}
        assert keys == {"descriptor0", "descriptor1"} and ledger.epsilon(c, unit="example", observer="server") > 0
    selection = runner.state["selection"]
    for c in (1, 2, 3):
        for task, chosen in selection[str(c)].items():
            assert chosen and all(not (int(o) == c and int(u) >= int(task)) for o, u, _ in chosen)
    # relays arrived (task 0 from round 3, task 1 from its first round) and none was rejected
    received = sum(r.metrics[c].get("relays_received", 0) for r in history for c in (1, 2, 3))
    assert received > 0 and all(r.metrics[c].get("relays_rejected", 0) == 0 for r in history for c in (1, 2, 3))
    assert any(float(trainers[1].model.tasks["1"].foreign(n).abs().sum()) > 0 for n in trainers[1].model.kernel_names)
    last = history[-1].metrics[1]
    assert set(last) >= {"acc_task0", "acc_task1", "accuracy"} and last["tasks_seen"] == 2
    # B is one shared vector: every client evaluated with the server's
    b = runner.state[f"params.{BASE_PART}"]
    assert all(np.allclose(t.get_shared()[BASE_PART], b, atol=1e-6) for t in trainers.values())


def test_fedweit_relays_every_other_clients_current_adaptive(world):
    schedule = Schedule(tasks=2, rounds_per_task=2)
    trainers = _trainers(world, mode="fedweit", slots=2)
    algorithm = FedWeIT(schedule=schedule, peers=world["peers"], run="w", consent=frozenset({1, 2}))
    _, history, ledger = _run(world, algorithm, trainers, schedule)
    assert ledger.clients() == []                                    # FedWeIT releases no descriptors
    assert [history[0].metrics[c]["relays_received"] for c in (1, 2, 3)] == [0, 0, 0]
    # from round 2: two consenting owners (1, 2); client 3 never sends
    assert [history[2].metrics[c]["relays_received"] for c in (1, 2, 3)] == [1, 1, 2]


def test_forged_relays_are_rejected_not_fatal(world):
    schedule = Schedule(tasks=2, rounds_per_task=2)
    trainers = _trainers(world, mode="fedseit", slots=2)
    algorithm = FedSeIT(schedule=schedule, top_k=2, descriptor=_descriptor(), peers=world["peers"], run="f")
    trainer = trainers[2]
    honest = PeerChannel(client_id=1, keys=world["keys"][1], directory=world["peers"], run="f",
                         purpose="fcl-foreign-adaptive")
    names = trainer.model.kernel_names
    zeros = {n: torch.zeros_like(p) for n, p in trainer.model.base.items()}
    good = honest.seal(receiver=2, round=2, plaintext=pack_adaptive(0, zeros, names))
    wrong_size = honest.seal(receiver=2, round=2, plaintext=b"FSA1\x00\x00\x00\x00" + b"\x00" * 8)
    inbox = (Relayed(sender=1, round=2, ciphertext=good.ciphertext),
             Relayed(sender=3, round=2, ciphertext=good.ciphertext),      # claims another sender
             Relayed(sender=1, round=2, ciphertext=wrong_size.ciphertext))
    broadcast = ClientBroadcast(round=3, common={BASE_PART: trainer.get_shared()[BASE_PART]},
                                own={"foreign": np.array([1, 0, 1.0], dtype=np.float32)}, inbox=inbox)
    context = ClientContext(client_id=2, state={}, trainer=trainer, round=3, releases=algorithm.releases, ledger=Ledger())
    upload, state = algorithm.client_update(broadcast=broadcast, client=context)
    assert upload.metrics["relays_received"] == 1 and upload.metrics["relays_rejected"] == 2
    assert state["foreign_keys"] == {"1": [[1, 0]]}


def test_local_and_fedavg_b(world):
    schedule = Schedule(tasks=2, rounds_per_task=2)
    local = _trainers(world, mode="fedweit", slots=0)
    _, history, _ = _run(world, LocalContinual(schedule=schedule), local, schedule)
    assert all(sum(r.bytes_uploaded.values()) == 0 for r in history)   # no secure sum ever ran
    bases = [t.get_shared()[BASE_PART] for t in local.values()]
    assert not np.allclose(bases[0], bases[1])                      # nothing shared: B drifts apart
    shared = _trainers(world, mode="fedweit", slots=0)
    runner, history, ledger = _run(world, ContinualFedAvg(schedule=schedule), shared, schedule)
    b = runner.state[f"params.{BASE_PART}"]
    assert all(np.allclose(t.get_shared()[BASE_PART], b, atol=1e-6) for t in shared.values())
    assert ledger.clients() == [] and history[-1].metrics[1]["tasks_seen"] == 2


def test_fedprox_term_holds_b_near_the_broadcast(world):
    """With FedProx's mu the uploaded B delta is smaller than without (same seed, same data)."""
    schedule = Schedule(tasks=2, rounds_per_task=2)
    norms = {}
    for mu in (0.0, 100.0):
        trainer = _trainers(world, mode="fedweit", slots=0)[1]
        broadcast = ClientBroadcast(round=1, common={BASE_PART: trainer.get_shared()[BASE_PART]})
        context = ClientContext(client_id=1, state={}, trainer=trainer, round=1)
        ContinualFedAvg(schedule=schedule, local_epochs=2, mu=mu).client_update(broadcast=broadcast, client=context)
        norms[mu] = float(np.linalg.norm(trainer.get_shared()[BASE_PART] - broadcast[BASE_PART]))
    assert 0 < norms[100.0] < 0.5 * norms[0.0]
    with pytest.raises(ValueError, match="mu"):
        ContinualFedAvg(schedule=schedule, mu=-1.0)


def test_without_sit_selects_every_candidate_sit_fewer():
    peers = PeerDirectory.generate([1, 2, 3])[0]
    schedule = Schedule(tasks=3, rounds_per_task=2)
    e = np.eye(8)[:2]
    descriptors = {"1:0": e, "1:1": e, "1:2": e, "2:0": e, "2:1": -e, "3:0": 0.5 * e + 0.5 * np.eye(8)[2:4],
                   "3:2": e}
    every = FedSeIT(schedule=schedule, selection="all", peers=peers)
    assert every.releases == {}                                       # no selection: no descriptor released
    chosen = every.select(client=1, task=1, descriptors=descriptors, started=1, round=1)
    # every candidate SIT ranks (own earlier, the others' started tasks), unranked, with equal alphas
    assert [(int(o), int(u)) for o, u, _ in chosen] == [(1, 0), (2, 0), (2, 1), (3, 0)]
    assert [a for *_, a in chosen] == [0.25] * 4
    sit = FedSeIT(schedule=schedule, top_k=2, descriptor=_descriptor(), peers=peers)
    picked = sit.select(client=1, task=1, descriptors=descriptors, started=1, round=1)
    assert len(picked) == 2 and {(o, u) for o, u, _ in picked} < {(o, u) for o, u, _ in chosen}
    # the foreign slots 'all' needs: clients x (tasks - 1), the paper's setting (3 clients, 5 tasks) 12
    assert max_candidates(Schedule(tasks=5, rounds_per_task=3), 3) == 12
    assert max_candidates(Schedule(tasks=1, rounds_per_task=3), 3) == 2
    with pytest.raises(ValueError, match="selection 'all' relays adaptives: give the peer directory"):
        FedSeIT(schedule=schedule, selection="all")


def test_without_sit_uses_every_foreign_adaptive_and_costs_more_bytes(world):
    """FedSeIT without SIT against SIT with K = 1 on the same clients: every candidate reaches every
    task's model (more relays, more bytes), and no descriptor is charged to any ledger."""
    schedule = Schedule(tasks=2, rounds_per_task=3)
    slots = max_candidates(schedule, 3)
    runs = {}
    for name, algorithm, k in (("all", FedSeIT(schedule=schedule, selection="all", peers=world["peers"], run="a"), slots),
                               ("sit1", FedSeIT(schedule=schedule, top_k=1, descriptor=_descriptor(),
                                                peers=world["peers"], run="s"), 1)):
        trainers = _trainers(world, mode="fedseit", slots=k)
        runner, history, ledger = _run(world, algorithm, trainers, schedule)
        runs[name] = dict(selection=runner.state["selection"], history=history, ledger=ledger, trainers=trainers)
    every, sit = runs["all"], runs["sit1"]
    assert every["ledger"].clients() == [] and sit["ledger"].clients() == [1, 2, 3]
    for c in (1, 2, 3):
        # task 0: the other clients' first tasks; task 1: every client's task 0 (its own included)
        assert sorted((int(o), int(u)) for o, u, _ in every["selection"][str(c)]["0"]) == [(o, 0) for o in (1, 2, 3)
                                                                                         if o != c]
        assert sorted((int(o), int(u)) for o, u, _ in every["selection"][str(c)]["1"]) == [(1, 0), (2, 0), (3, 0)]
        assert all(len(chosen) == 1 for chosen in sit["selection"][str(c)].values())
        # every foreign adaptive of task 1 is in the model: all three slots hold a nonzero kernel
        foreign = every["trainers"][c].model.tasks["1"].foreign("conv3")
        assert all(float(foreign[i].abs().sum()) > 0 for i in range(3))

    def total(run, key):
        return sum(r.metrics[c].get(key, 0.0) for r in run["history"] for c in (1, 2, 3))

    assert total(every, "relays_received") == 12 and total(every, "relays_rejected") == 0   # 3 clients x (2 + 2)
    assert total(every, "relay_bytes_received") > total(sit, "relay_bytes_received") > 0
    assert total(every, "relay_bytes_sent") >= total(every, "relay_bytes_received")
    assert total(every, "relay_bytes_descriptors") == 0 < total(sit, "relay_bytes_descriptors")
