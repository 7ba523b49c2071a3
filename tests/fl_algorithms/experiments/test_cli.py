import argparse
import re

import pytest

from fl_algorithms.experiments.cli import comma_list
from fl_algorithms.experiments.task import check_options, int_option, settings_option
from fl_algorithms.tasks.fednlp import FedNLPSettings


def test_comma_list_parses_checks_choices_and_repeats():
    seeds = comma_list(int, what="seed")
    assert seeds(" 0, 1,2 ") == (0, 1, 2)
    methods = comma_list(str, what="method", choices=("a", "b"))
    assert methods("b,a") == ("b", "a")
    for parse, text, message in ((seeds, ",", "at least one seed"), (seeds, "0,x", "comma list of seeds"),
                                 (methods, "a,c", "unknown method(s) ['c']"), (methods, "a,a", "repeated methods")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
            parse(text)


def test_task_option_helpers_name_what_is_wrong():
    check_options({"a": "1"}, ("a", "b"), task="t")
    with pytest.raises(ValueError, match=r"unknown t task options \['z'\]"):
        check_options({"z": "1"}, ("a",), task="t")
    assert settings_option(FedNLPSettings, {}) == FedNLPSettings()
    assert settings_option(FedNLPSettings, {"settings": '{"clients": 5, "clients_per_round": 2}'}).clients == 5
    for text, message in (("{", "not JSON"), ("[]", "JSON object"), ('{"x": 1}', "unknown settings")):
        with pytest.raises(ValueError, match=message):
            settings_option(FedNLPSettings, {"settings": text})
    assert int_option({}, "threads", default=1, minimum=1) == 1
    assert int_option({"threads": "3"}, "threads", default=1, minimum=1) == 3
    for text, message in (("x", "must be an integer"), ("0", "at least 1")):
        with pytest.raises(ValueError, match=message):
            int_option({"threads": text}, "threads", default=1, minimum=1)
