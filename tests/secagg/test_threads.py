"""The one thread cap: the request (or every available core), at most $FEDSECURE_MAX_THREADS."""
from __future__ import annotations

import pytest

from secagg import threads


def test_the_default_is_every_available_core_and_the_environment_caps_any_request(monkeypatch):
    monkeypatch.delenv(threads.MAX_THREADS_ENV, raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 6)
    assert threads.thread_cap() == 6
    assert threads.thread_cap(3) == 3
    monkeypatch.setenv(threads.MAX_THREADS_ENV, "2")
    assert threads.thread_cap() == 2
    assert threads.thread_cap(1) == 1
    monkeypatch.setenv(threads.MAX_THREADS_ENV, "0")  # a cap below one still leaves one thread
    assert threads.thread_cap(4) == 1


def test_bad_requests_and_bad_caps_are_refused(monkeypatch):
    monkeypatch.delenv(threads.MAX_THREADS_ENV, raising=False)
    with pytest.raises(ValueError, match="positive"):
        threads.thread_cap(0)
    monkeypatch.setenv(threads.MAX_THREADS_ENV, "many")
    with pytest.raises(ValueError, match=threads.MAX_THREADS_ENV):
        threads.thread_cap(2)


def test_available_cores_is_at_least_one():
    assert threads.available_cores() >= 1
