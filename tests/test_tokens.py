"""Token counts: a size estimate everywhere, exact counts offline from litellm's files, released when idle."""

from __future__ import annotations

import os

from nanobotd import tokens


def test_counts_offline_without_importing_litellm_or_writing_the_environment():
    before = dict(os.environ)
    tokens.get_encoding.cache_clear()
    assert tokens.count_tokens("hello world") == 2
    assert tokens.count_tokens("") == 0
    assert dict(os.environ) == before
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


def test_both_encodings_count_as_tiktoken_builds_them(monkeypatch):
    import tiktoken
    from tiktoken_ext import openai_public

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tokens.tokenizer_dir()))  # tiktoken's own build, offline
    texts = ["hello world", "Grüße aus Köln — 東京 🚀", "def f(x):\n    return x ** 2\n", "a" * 5000,
             "tool call {\"a\": [1, 2, 3]}", "  leading   spaces\t\ttabs\n\n\n", "x <|endoftext|> y"]
    for name in ("o200k_base", "cl100k_base"):
        reference = tiktoken.Encoding(**getattr(openai_public, name)())
        assert [tokens.count_tokens(text, name) for text in texts] == [
            len(reference.encode_ordinary(text)) for text in texts]
        assert tokens.get_encoding(name).n_vocab == reference.n_vocab


def test_a_text_past_the_counted_cap_is_estimated_beyond_it():
    text = "word " * (tokens.MAX_COUNTED_CHARS // 5 + 1000)
    head = len(tokens.get_encoding().encode_ordinary(text[:tokens.MAX_COUNTED_CHARS]))
    assert tokens.count_tokens(text) == head + (len(text) - tokens.MAX_COUNTED_CHARS) // 4


def test_the_estimate_goes_by_utf8_size_and_never_reads_an_encoding():
    tokens.get_encoding.cache_clear()
    assert tokens.estimate_tokens("") == 0
    assert tokens.estimate_tokens("abc") == 1
    assert tokens.estimate_tokens("日本語") > tokens.estimate_tokens("abc")  # 9 bytes, not 3 characters
    assert tokens.estimate_tokens("\ud800 lone surrogate") > 0
    assert not tokens.encodings_loaded()
