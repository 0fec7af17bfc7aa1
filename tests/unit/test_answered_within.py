"""errors.answered_within: the one bounded wait on a storage or a tracking server that may not
answer; errors.seconds_from_env: its bound from the environment."""
import threading
import time

import pytest

from distppo.errors import UserError, answered_within, seconds_from_env


def test_an_answer_is_returned_and_an_error_raised_as_itself():
    assert answered_within(lambda: 42, 5, "silent") == 42
    with pytest.raises(KeyError, match="refused"):
        answered_within(lambda: {}["refused"], 5, "silent")


def test_no_answer_is_one_user_error_at_the_bound():
    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(UserError, match="^the server did not answer$"):
        answered_within(lambda: release.wait(30), 0.5, "the server did not answer")
    assert 0.5 <= time.monotonic() - start < 2
    release.set()


def test_seconds_from_the_environment(monkeypatch):
    monkeypatch.delenv("DISTPPO_X_TIMEOUT_S", raising=False)
    assert seconds_from_env("DISTPPO_X_TIMEOUT_S", 20.0) == 20.0
    monkeypatch.setenv("DISTPPO_X_TIMEOUT_S", " 2.5 ")
    assert seconds_from_env("DISTPPO_X_TIMEOUT_S", 20.0) == 2.5
    monkeypatch.setenv("DISTPPO_X_TIMEOUT_S", "soon")
    with pytest.raises(UserError, match=r"^DISTPPO_X_TIMEOUT_S='soon': give a number of seconds$"):
        seconds_from_env("DISTPPO_X_TIMEOUT_S", 20.0)
