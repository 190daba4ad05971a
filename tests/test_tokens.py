"""Offline token counting, and giving the encoding's memory back when idle."""

from __future__ import annotations

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


def test_a_batch_counts_exactly_what_one_text_at_a_time_counts():
    texts = ["hello <|endoftext|> world", "", "x" * 10, "é" * 5, "\ud800 lone surrogate", "tool call {\"a\": 1}"]
    texts = texts * 40  # large enough to be split over threads
    assert tokens.count_tokens_batch(texts) == [tokens.count_tokens(text) for text in texts]
    assert tokens.count_tokens_batch([]) == []
