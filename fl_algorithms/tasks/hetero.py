"""ATC's heterogeneous clients: several NLP task formulations, several clients per task, on offline data.

ATC (Assign-Then-Contrast) trains 18 clients over six datasets and three formulations with the
layout 1 / 3 / 3 / 2 / 5 / 4 (IMDB, AGNews, SQuAD, NewsQA, CNN/DM, MSQG; FederatedScope
``hetero_data_name``, ``num_of_client_for_data``). The offline stand-ins here, in the same order and
counts (`LAYOUT`, stated in docs/results/atc.md):

    rt_sentiment   classification  1   Rotten Tomatoes rotten / fresh           (IMDB)
    bbc_topic      classification  3   BBC News, 5 topics                        (AGNews)
    cloze_qa       extractive QA   3   cloze questions over BBC articles         (SQuAD)
    tweets_ner     tagging         2   tweets, 10 entity types, BIO              (NewsQA: no second QA corpus)
    bbc_headline   generation      5   BBC headline from the article body        (CNN/DM)
    debates_party  classification  4   2016 debates, speaker's party             (MSQG: no second generation corpus)

Three datasets come from the same BBC articles; each article is given to exactly one of them (a
seeded three-way split of the 2,127 distinct articles), so no article reaches two clients. Each
dataset is split evenly over its clients after a seeded shuffle (the reference splits sequentially),
and every client splits its share 6:2:2 into train, validation and test. `texts` are what the
ASSIGN stage pre-trains on: the client's own training inputs (passages for QA, bodies for generation).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nlp_models.data.cloze_qa import build_cloze_qa
from nlp_models.data.dataset import split_indices
from nlp_models.data.headlines import split_headline
from nlp_models.data.loaders import load_bbc_news, load_debates_2016, load_rt_sentiment, load_tweets_ner

FORMULATIONS = ("classification", "tagging", "qa", "generation")
BBC_DATASETS = ("bbc_topic", "cloze_qa", "bbc_headline")


@dataclass(frozen=True)
class HeteroDataset:
    name: str
    formulation: str
    clients: int


LAYOUT: tuple[HeteroDataset, ...] = (
    HeteroDataset("rt_sentiment", "classification", 1),
    HeteroDataset("bbc_topic", "classification", 3),
    HeteroDataset("cloze_qa", "qa", 3),
    HeteroDataset("tweets_ner", "tagging", 2),
    HeteroDataset("bbc_headline", "generation", 5),
    HeteroDataset("debates_party", "classification", 4),
)


@dataclass(frozen=True)
class HeteroClient:
    """One client's share: its dataset and formulation, and train / validation / test examples.

    Examples by formulation: classification (text, label); tagging (words, tag ids); qa a
    `ClozeExample`; generation (body, headline). `label_names` name the classes or tags.
    """

    client_id: int
    dataset: str
    formulation: str
    label_names: tuple[str, ...]
    train: tuple[Any, ...]
    validation: tuple[Any, ...]
    test: tuple[Any, ...]

    @property
    def texts(self) -> tuple[str, ...]:
        """The training inputs as plain text (what the ASSIGN stage corrupts and reconstructs)."""
        return tuple(_input_text(self.formulation, example) for example in self.train)


def _input_text(formulation: str, example: Any) -> str:
    if formulation == "classification":
        return example[0]
    if formulation == "tagging":
        return " ".join(example[0])
    if formulation == "qa":
        return example.passage
    return example[0]


def bbc_pools(seed: int) -> dict[str, np.ndarray]:
    """Disjoint pools of distinct-article indices (of ``load_bbc_news(dedupe=True)``) per BBC dataset."""
    n = len(load_bbc_news(dedupe=True))
    order = np.random.default_rng([seed, 0xB8C]).permutation(n)
    return {name: np.sort(part) for name, part in zip(BBC_DATASETS, np.array_split(order, len(BBC_DATASETS)))}


def dataset_examples(name: str, *, seed: int, max_length: int = 64) -> tuple[list[Any], tuple[str, ...]]:
    """All examples of one layout dataset (BBC-derived ones restricted to their article pool); cloze
    questions and passages are cut to what mostly fits `max_length` tokens (`tasks.qa.cloze_budget`)."""
    if name == "rt_sentiment":
        data = load_rt_sentiment(dedupe=True)
        return list(zip(data.texts, data.labels)), data.label_names
    if name == "debates_party":
        data = load_debates_2016(dedupe=True)
        return list(zip(data.texts, data.labels)), data.label_names
    if name == "tweets_ner":
        data = load_tweets_ner()
        return list(zip(data.words, data.labels)), data.label_names
    if name not in BBC_DATASETS:
        raise ValueError(f"unknown dataset {name!r}; the layout has {[d.name for d in LAYOUT]}")
    pool = set(bbc_pools(seed)[name].tolist())
    if name == "cloze_qa":
        from fl_algorithms.tasks.qa import cloze_budget

        question_words, passage_words = cloze_budget(max_length)
        corpus = build_cloze_qa(seed=seed, max_passage_words=passage_words, max_question_words=question_words)
        return [e for e in corpus.examples if e.article in pool], corpus.label_names
    data = load_bbc_news(dedupe=True)
    if name == "bbc_topic":
        return [(data.texts[i], data.labels[i]) for i in sorted(pool)], data.label_names
    pairs = [split_headline(data.texts[i]) for i in sorted(pool)]
    return [(body, head) for head, body in pairs], ()


def build_clients(*, layout: Sequence[HeteroDataset] = LAYOUT, seed: int = 0,
                  max_per_client: int | None = None, max_length: int = 64) -> dict[int, HeteroClient]:
    """Clients 1..N in layout order: each dataset shuffled (seeded), split evenly over its clients,
    each share capped at `max_per_client` examples and split 6:2:2 (`max_length`: the model's input
    length, which sizes the cloze passages)."""
    for entry in layout:
        if entry.formulation not in FORMULATIONS or entry.clients < 1:
            raise ValueError(f"bad layout entry {entry}")
    if max_per_client is not None and max_per_client < 5:
        raise ValueError("max_per_client must be at least 5 (a 6:2:2 split needs them)")
    clients, next_id = {}, 1
    for entry in layout:
        examples, names = dataset_examples(entry.name, seed=seed, max_length=max_length)
        order = np.random.default_rng([seed, len(entry.name), sum(map(ord, entry.name))]).permutation(len(examples))
        for share in np.array_split(order, entry.clients):
            if max_per_client is not None:
                share = share[:max_per_client]
            train, validation, test = split_indices(len(share), seed=seed + next_id)
            pick = lambda idx: tuple(examples[int(share[i])] for i in idx)  # noqa: E731
            clients[next_id] = HeteroClient(client_id=next_id, dataset=entry.name, formulation=entry.formulation,
                                            label_names=tuple(names), train=pick(train), validation=pick(validation),
                                            test=pick(test))
            next_id += 1
    return clients


def public_texts(count: int = 16, *, seed: int = 0) -> tuple[str, ...]:
    """CONTRAST's public inputs: plot sentences of the Rotten Tomatoes corpus, which no client holds
    (rt_sentiment takes only its review snippets; no other layout dataset comes from it). Seeded choice."""
    from nlp_models.data.loaders import load_rt_subjectivity

    if count < 1:
        raise ValueError("need at least one public input")
    data = load_rt_subjectivity(dedupe=True)
    plots = [t for t, y in zip(data.texts, data.labels) if y == 0]
    order = np.random.default_rng([seed, 0x9B1]).permutation(len(plots))[:count]
    return tuple(plots[i] for i in sorted(order))


def layout_table(clients: Mapping[int, HeteroClient]) -> list[dict[str, Any]]:
    """One row per client: dataset, formulation and split sizes (for the results page and the example)."""
    return [{"client": c.client_id, "dataset": c.dataset, "formulation": c.formulation, "train": len(c.train),
             "validation": len(c.validation), "test": len(c.test)} for c in clients.values()]


__all__ = ["FORMULATIONS", "BBC_DATASETS", "HeteroDataset", "LAYOUT", "HeteroClient", "bbc_pools", "dataset_examples",
           "build_clients", "public_texts", "layout_table"]
