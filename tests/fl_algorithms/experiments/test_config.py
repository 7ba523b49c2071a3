import pytest

from fl_algorithms.experiments.config import check_choices, check_seeds, from_dict, load_toml
from fl_algorithms.engine.sim import RunConfig


def test_toml_round_trip_into_nested_frozen_configs(tmp_path):
    p = tmp_path / "run.toml"
    p.write_text('rounds = 7\nseed = 3\n[secure]\nprotocol = "secagg"\nclip = 2.0\n')
    cfg = load_toml(RunConfig, p)
    assert cfg.rounds == 7 and cfg.secure.protocol == "secagg" and cfg.secure.clip == 2.0
    with pytest.raises(Exception, match="cannot assign to field 'rounds'"):
        cfg.rounds = 3


def test_unknown_keys_and_bad_values_are_refused():
    with pytest.raises(ValueError, match="unknown"):
        from_dict(RunConfig, {"roundz": 3})
    with pytest.raises(ValueError, match="protocol"):
        from_dict(RunConfig, {"secure": {"protocol": "rot13"}})
    with pytest.raises(ValueError, match="rounds"):
        from_dict(RunConfig, {"rounds": 0})


@pytest.mark.parametrize("values", [(), ("a", "a"), ("a", "z")])
def test_check_choices_refuses_empty_repeated_or_unknown_values(values):
    with pytest.raises(ValueError, match="methods must be distinct values from a, b"):
        check_choices("methods", values, ("a", "b"))


@pytest.mark.parametrize("seeds", [(), (1, 1), (0, -1)])
def test_check_seeds_refuses_empty_repeated_or_negative_seeds(seeds):
    with pytest.raises(ValueError, match="seeds must be distinct non-negative"):
        check_seeds(seeds)


def test_valid_choices_and_seeds_pass():
    check_choices("methods", ("b", "a"), ("a", "b"))
    check_seeds((2, 0, 1))
