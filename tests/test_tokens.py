"""Offline token counting, and giving the encoding's memory back when idle."""

from __future__ import annotations

import os
import threading

import pytest

from nanobotd import tokens


def test_counts_offline_without_importing_litellm():
    assert tokens.count_tokens("hello world") == 2
    assert tokens.count_tokens("") == 0
    assert tokens.encoding_name_for("openai/gpt-4o-mini") == "o200k_base"
    assert tokens.encoding_name_for("gpt-3.5-turbo") == "cl100k_base"


def test_an_idle_encoding_is_released_and_reloaded_on_demand():
    tokens.count_tokens("warm up")
    assert tokens.encodings_loaded()
    assert tokens.release_if_idle(3600) is False
    tokens._Usage.last_used -= 7200
    assert tokens.release_if_idle(3600) is True
    assert not tokens.encodings_loaded()
    assert tokens.count_tokens("hello world") == 2


def test_the_encoding_keeps_its_merge_ranks_only_in_the_core_and_counts_as_tiktoken_does():
    import tiktoken
    from tiktoken_ext import openai_public

    encoding = tokens.get_encoding("o200k_base")
    assert encoding._mergeable_ranks == {}  # the Python copy of the ~200k ranks is gone
    reference = tiktoken.Encoding(**openai_public.o200k_base())  # a whole one, built apart
    texts = ["hello world", "Grüße aus Köln — 東京 🚀", "def f(x):\n    return x ** 2\n", "a" * 5000,
             "tool call {\"a\": [1, 2, 3]}", "  leading   spaces\t\ttabs\n\n\n"]
    assert [tokens.count_tokens(text) for text in texts] == [len(reference.encode_ordinary(text)) for text in texts]
    assert encoding.n_vocab == reference.n_vocab


def test_a_batch_counts_exactly_what_one_text_at_a_time_counts():
    texts = ["hello <|endoftext|> world", "", "x" * 10, "é" * 5, "\ud800 lone surrogate", "tool call {\"a\": 1}"]
    texts = texts * 40  # large enough to be split over threads
    assert tokens.count_tokens_batch(texts) == [tokens.count_tokens(text) for text in texts]
    assert tokens.count_tokens_batch([]) == []


def failing_encoding(encoding, failed_in: list[str], failed: threading.Event | None = None):
    """get_encoding giving *encoding* except that counting the text "POISON" raises (in whichever thread)."""

    class Failing:
        def encode_ordinary(self, text: str) -> list[int]:
            if text == "POISON":
                failed_in.append(threading.current_thread().name)
                if failed is not None:
                    failed.set()
                raise RuntimeError("the tokenizer failed")
            return encoding.encode_ordinary(text)

    return lambda name=tokens.DEFAULT_ENCODING: Failing()


def counting_thread_names() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("tokens-")]


def test_the_counting_threads_start_for_a_large_batch_only_and_end_with_the_encoding():
    tokens.count_tokens("warm up")
    tokens._Usage.last_used -= 7200
    tokens.release_if_idle(3600)
    assert tokens.count_tokens_batch(["small batch"] * 10) == [2] * 10
    assert tokens.counting_threads() == 0 and counting_thread_names() == []
    texts = [f"text number {n}" for n in range(400)]
    assert tokens.count_tokens_batch(texts) == [tokens.count_tokens(text) for text in texts]
    assert tokens.submit_tokens_batch(texts[:3]).result() == [tokens.count_tokens(text) for text in texts[:3]]
    assert tokens.counting_threads() == min(tokens.BATCH_THREADS, os.cpu_count() or 1)
    assert all(thread.daemon for thread in threading.enumerate() if thread.name.startswith("tokens-"))
    tokens._Usage.last_used -= 7200
    assert tokens.release_if_idle(3600) is True
    assert tokens.counting_threads() == 0 and counting_thread_names() == []
    assert tokens.count_tokens_batch(texts) == [tokens.count_tokens(text) for text in texts]
    assert tokens.counting_threads() > 0


def test_a_text_over_the_counted_length_counts_its_head_exactly_and_the_rest_at_four_chars_a_token():
    text = "plain words and more " * (tokens.MAX_COUNTED_CHARS // 20) + "tail" * 1000
    head = len(tokens.get_encoding().encode_ordinary(text[:tokens.MAX_COUNTED_CHARS]))
    expected = head + (len(text) - tokens.MAX_COUNTED_CHARS) // 4
    assert tokens.count_tokens(text) == expected
    assert tokens.count_tokens_batch([text, "hello world"] + ["x"] * 200)[:2] == [expected, 2]
    assert tokens.submit_tokens_batch([text]).result() == [expected]


def test_a_failure_in_a_counting_thread_is_raised_where_the_counts_are_wanted(monkeypatch):
    failed_in: list[str] = []
    failed = threading.Event()
    monkeypatch.setattr(tokens, "get_encoding", failing_encoding(tokens.get_encoding(), failed_in, failed))
    batch = tokens.submit_tokens_batch(["POISON"] + ["hello world"] * 50)
    assert failed.wait(60)
    with pytest.raises(RuntimeError, match="the tokenizer failed"):
        batch.result()
    assert len(failed_in) == 1 and failed_in[0].startswith("tokens-")
    assert tokens.submit_tokens_batch(["hello world"] * 3).result() == [2, 2, 2]  # the thread still counts
