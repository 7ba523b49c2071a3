"""BBC News as a generation corpus: the article body as source, its headline as target.

Every BBC article's first line is its headline (mean 5.2 words, at most 9), then the body. This is
the offline stand-in for FedNLP's seq2seq data (Gigaword / CNN-DM headlines and summaries), and the
multi-domain corpus of AdaFedSelectKD: the five topics are the domains.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nlp_models.data.dataset import cap_indices


@dataclass(frozen=True)
class HeadlineCorpus:
    """Parallel tuples: article body, headline and topic label (index into `topic_names`)."""

    bodies: tuple[str, ...]
    headlines: tuple[str, ...]
    topics: tuple[int, ...]
    topic_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not len(self.bodies) == len(self.headlines) == len(self.topics):
            raise ValueError("bodies, headlines and topics must have one entry per article")

    def __len__(self) -> int:
        return len(self.bodies)

    def topic_array(self) -> np.ndarray:
        return np.asarray(self.topics, dtype=np.int64)

    def subset(self, indices: Sequence[int] | np.ndarray) -> "HeadlineCorpus":
        rows = [int(i) for i in indices]
        return HeadlineCorpus(tuple(self.bodies[i] for i in rows), tuple(self.headlines[i] for i in rows),
                              tuple(self.topics[i] for i in rows), self.topic_names)


def split_headline(text: str) -> tuple[str, str]:
    """(headline, body) of one BBC article: the first line, and the rest with paragraphs joined."""
    head, _, body = text.strip().partition("\n")
    body = " ".join(line.strip() for line in body.splitlines() if line.strip())
    if not head.strip() or not body:
        raise ValueError(f"article without a headline line and a body: {text[:80]!r}")
    return head.strip(), body


def load_bbc_headlines(*, max_examples: int | None = None, seed: int = 0, max_chars: int | None = 2000,
                       topics: Sequence[str] | None = None) -> HeadlineCorpus:
    """Distinct BBC articles as (body, headline) pairs, capped stratified by topic (deterministic by seed).

    `max_chars` cuts long bodies (the encoder reads far fewer tokens anyway); `topics` keeps only
    those topics (names as in the corpus: business, entertainment, politics, sport, tech), in that
    order as labels.
    """
    from nlp_models.data.loaders import load_bbc_news

    news = load_bbc_news(dedupe=True)
    names = tuple(news.label_names) if topics is None else tuple(topics)
    unknown = set(names) - set(news.label_names)
    if unknown:
        raise ValueError(f"unknown BBC topics {sorted(unknown)}; the corpus has {', '.join(news.label_names)}")
    rows = [i for i, label in enumerate(news.labels) if news.label_names[label] in names]
    labels = np.asarray([names.index(news.label_names[news.labels[i]]) for i in rows], dtype=np.int64)
    if max_examples is not None:
        keep = np.sort(cap_indices(len(rows), max_examples, seed=seed, labels=labels))
        rows, labels = [rows[i] for i in keep], labels[keep]
    pairs = [split_headline(news.texts[i]) for i in rows]
    return HeadlineCorpus(bodies=tuple(body[:max_chars] if max_chars else body for _, body in pairs),
                          headlines=tuple(head for head, _ in pairs), topics=tuple(int(y) for y in labels),
                          topic_names=names)


def lead_words(body: str, count: int) -> str:
    """The trivial headline: the body's first `count` words."""
    return " ".join(body.split()[:max(count, 1)])


__all__ = ["HeadlineCorpus", "split_headline", "load_bbc_headlines", "lead_words"]
