"""Every TOML under examples/configs/ loads into a RunConfig and runs a round of its task."""
from pathlib import Path

import pytest

from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.experiments.config import load_toml
from fl_algorithms.tasks.toy import build

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "examples" / "configs").glob("*.toml"))


def test_there_are_example_configs():
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads_and_runs_one_round(path):
    config = load_toml(RunConfig, path)
    ledger = None
    if config.secure.distributed_dp is not None:
        from dp.ledger import Ledger

        ledger = Ledger()
    task = build({})
    runner = SimulationRunner(algorithm=task.algorithm, trainers={c: task.make_trainer(c) for c in range(1, 5)},
                              config=config, ledger=ledger)
    rec = runner.run_round(1)
    assert rec.contributors and 0.0 <= rec.mean("accuracy") <= 1.0
    if ledger is not None:
        for c in rec.contributors:  # one debit per observer, for this round
            entries = ledger.entries(c)
            assert {e.observer.value for e in entries} == {"server", "outsider"}
            assert all(e.rounds == (1,) and e.unit.value == "client" for e in entries)
