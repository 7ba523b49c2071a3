"""FirstRunMemo: a fresh client's first local run computed once for the runs that repeat it."""
import numpy as np
import torch

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedopt import FedAvgM
from fl_algorithms.algorithms.fedprox import FedProx
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.tasks.toy import toy_trainer
from fl_algorithms.training.memo import FirstRunMemo
from fl_algorithms.training.protocol import FEDNLP
from fl_algorithms.training.trainer import OptimizerConfig, SeededTorchTrainer

CLIENTS = (1, 2, 3)


def _trainer(client_id: int, memo: FirstRunMemo | None, protocol=None) -> SeededTorchTrainer:
    """A toy client with a private head, AdamW (state kept across rounds) and a seeded random batch order."""
    base = toy_trainer(client_id, private_head=True)
    x = torch.cat([b["x"] for b in base.train_batches()])
    y = torch.cat([b["y"] for b in base.train_batches()])

    def batches():
        order = torch.randperm(len(y))  # the global RNG, seeded per local run
        return [{"x": x[order[i:i + 16]], "y": y[order[i:i + 16]]} for i in range(0, len(y), 16)]

    return SeededTorchTrainer(client_id=client_id, seed=4, first_runs=memo, model=base.model,
                              shared={"body": ["body.weight", "body.bias"]}, train_batches=batches,
                              eval_batches=base.eval_batches, num_examples=len(y), loss_fn=base.loss_fn,
                              metric_fn=base.metric_fn, optimizer=OptimizerConfig(name="adamw", lr=0.05),
                              protocol=protocol)


def _run(algorithm, memo: FirstRunMemo | None, *, initial=None, rounds: int = 3, protocol=None):
    trainers = {c: _trainer(c, memo, protocol) for c in CLIENTS}
    start = initial if initial is not None else trainers[1].get_shared()
    runner = SimulationRunner(algorithm=algorithm, trainers=trainers, initial=dict(start),
                              config=RunConfig(rounds=rounds, sampler="seeded", seed=1,
                                               secure=SecureAggregationConfig(
                                                   protocol="plain", min_release_group=len(CLIENTS),
                                                   insecure_seed=7)))  # reproducible rounding: tests only
    runner.run(progress=False)
    body = algorithm.shared_parameters(runner.state)["body"]
    heads = {c: t.model.head.weight.detach().clone() for c, t in trainers.items()}  # private: never uploaded
    return body, heads, runner.history


def test_a_restored_first_run_gives_the_run_a_fresh_computation_gives_bit_for_bit():
    memo = FirstRunMemo()
    _run(FedAvg(local_epochs=2), memo)  # fills the memo with every client's first run
    assert memo.hits == 0 and len(memo.runs) == len(CLIENTS)  # later runs (calls > 0) are not kept
    shared_body, shared_heads, shared_history = _run(FedAvgM(server_lr=1.0, beta1=0.9, local_epochs=2), memo)
    assert memo.hits == len(CLIENTS) and memo.reused_seconds > 0
    fresh_body, fresh_heads, fresh_history = _run(FedAvgM(server_lr=1.0, beta1=0.9, local_epochs=2), None)
    np.testing.assert_array_equal(shared_body, fresh_body)
    for c in CLIENTS:  # the private head and the AdamW state behind it were restored too
        assert torch.equal(shared_heads[c], fresh_heads[c])
    assert [r.mean("train_loss") for r in shared_history] == [r.mean("train_loss") for r in fresh_history]
    assert not np.array_equal(fresh_body, _run(FedAvg(local_epochs=2), None)[0])  # FedAvgM did change the run


def test_a_different_objective_start_or_epoch_count_is_computed_not_restored():
    memo = FirstRunMemo()
    first_body, _, _ = _run(FedAvg(local_epochs=1), memo, rounds=1)
    _run(FedProx(mu=0.5, local_epochs=1), memo, rounds=1)  # + mu/2 ||w - w_global||^2: another objective
    _run(FedAvg(local_epochs=2), memo, rounds=1)
    moved = {"body": first_body.astype(np.float32)}
    _run(FedAvg(local_epochs=1), memo, initial=moved, rounds=1)  # another broadcast model
    assert memo.hits == 0 and len(memo.runs) == 4 * len(CLIENTS)
    _run(FedProx(mu=0.5, local_epochs=1), memo, rounds=1)
    assert memo.hits == len(CLIENTS)


def test_the_digest_reads_the_anchor_only_where_fedprox_uses_it():
    model = toy_trainer(1).model
    digest = lambda **kw: FirstRunMemo.digest(client_id=1, seed=0, model=model, optimizer="adamw",  # noqa: E731
                                              epochs=1, **kw)
    anchor = {"body": np.zeros(3, dtype=np.float32)}
    assert digest(proximal=anchor, mu=0.0) == digest(proximal=None, mu=0.0)  # mu = 0: plain FedAvg
    assert digest(proximal=anchor, mu=0.1) != digest(proximal={"body": np.ones(3, dtype=np.float32)}, mu=0.1)
    assert digest(proximal=anchor, mu=0.1) != digest(proximal=anchor, mu=0.2)
    before = digest(proximal=None, mu=0.0)
    assert before != FirstRunMemo.digest(client_id=2, seed=0, model=model, optimizer="adamw", epochs=1,
                                         proximal=None, mu=0.0)
    with torch.no_grad():
        model.head.bias.add_(1e-3)  # a private parameter: not broadcast, still read by the run
    assert digest(proximal=None, mu=0.0) != before


def test_a_restored_first_run_is_exact_when_the_optimiser_is_fresh_each_round():
    """FedNLP's protocol (AdamW for FedOPT, rebuilt every round, warmup and decay, clipping): the restored
    first run leaves no optimiser state behind, and the later rounds build theirs afresh either way."""
    protocol = FEDNLP.for_algorithm("fedopt", lr=0.05, local_epochs=2)
    memo = FirstRunMemo()
    _run(FedAvg(local_epochs=2), memo, protocol=protocol)
    shared_body, shared_heads, shared_history = _run(FedAvgM(server_lr=1.0, beta1=0.9, local_epochs=2), memo,
                                                     protocol=protocol)
    assert memo.hits == len(CLIENTS)
    fresh_body, fresh_heads, fresh_history = _run(FedAvgM(server_lr=1.0, beta1=0.9, local_epochs=2), None,
                                                  protocol=protocol)
    np.testing.assert_array_equal(shared_body, fresh_body)
    for c in CLIENTS:
        assert torch.equal(shared_heads[c], fresh_heads[c])
    assert [r.mean("train_loss") for r in shared_history] == [r.mean("train_loss") for r in fresh_history]
    kept = FirstRunMemo()  # another protocol is another digest: nothing restored across protocols
    _run(FedAvg(local_epochs=2), kept, protocol=protocol, rounds=1)
    _run(FedAvg(local_epochs=2), kept, rounds=1)
    assert kept.hits == 0 and len(kept.runs) == 2 * len(CLIENTS)
