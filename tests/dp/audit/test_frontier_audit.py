"""The privacy frontier's `--audit`: its DDP setting audited with canary clients (fl_algorithms.experiments.frontier.
audit_ddp), with the frontier's own DDP configuration; the example's flag and its line."""
import importlib
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fl_algorithms.experiments.frontier import AuditPlan, FrontierConfig, audit_ddp, secure_config
from nlp_models.bag_of_tokens import BagTaskConfig

LINE = re.compile(r"^audit mechanism=ddp claimed_eps=8 empirical_eps=(\S+) eps_lower_bound=(\S+) canaries=(\d+)$")


@pytest.fixture(scope="module")
def audited():
    config = BagTaskConfig(num_clients=100, public_fraction=0.1, seed=0)
    cfg = FrontierConfig(task=config, rounds=8, cohort=20, epsilons=(4.0, 8.0), mechanisms=("ddp",), seed=0)
    task = SimpleNamespace(config=config, clients={c: SimpleNamespace(train=[0] * 10) for c in range(1, 101)})
    return cfg, task, audit_ddp(task, cfg, plan=AuditPlan(trials=6, canaries_per_trial=8, held_out_per_trial=32))


def test_the_audit_line_and_keys(audited):
    _, _, out = audited
    m = LINE.match(out["line"])
    assert m, out["line"]
    assert float(m.group(2)) <= 8 and int(m.group(3)) == 6 * 40 == out["canaries"]
    assert out["setting"] == "ddp_eps8" and out["claimed_eps"] == 8.0
    assert out["eps_lower_bound"] == out["epsilon_lower_bound"] and out["empirical_eps"] == out["empirical_epsilon"]
    assert out["server_eps"] == pytest.approx(8.0, abs=1e-3)  # the plan at the audit's dimension meets the target


def test_the_audit_uses_the_settings_own_ddp_configuration(audited):
    cfg, task, out = audited
    setting = next(s for s in cfg.settings() if s.name == "ddp_eps8")
    ddp = secure_config(setting, task, cfg)[0].distributed_dp
    described = out["mechanism_description"]
    assert (described["min_clients"], described["expected_clients"], described["bits"], described["l2_clip"]) == (
        ddp.n_min, ddp.expected_clients, ddp.bits, ddp.l2_clip)
    assert out["rounds"] == cfg.rounds and out["delta"] == cfg.delta and out["one_run_lower_bound"] is not None


def test_the_example_takes_the_flag():
    examples = str(Path(__file__).resolve().parents[3] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    frontier = importlib.import_module("privacy_frontier")
    assert frontier.parse_args(["--quick", "--audit"]).audit is True
    assert frontier.AUDIT_KEYS == ("claimed_eps", "empirical_eps", "eps_lower_bound")
