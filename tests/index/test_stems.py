"""nanobotd/index/stems.py: Python sees the same stems FTS5 indexes."""

from __future__ import annotations

from nanobotd.index.stems import Stemmer


def test_words_get_the_stems_fts5_indexes_them_under():
    stemmer = Stemmer()
    assert stemmer.stems(["running", "happy", "café", "painted", "x_y"]) == ["run", "happi", "cafe", "paint", "x"]


def test_text_becomes_its_stems_in_order_and_unknown_words_are_learned_once():
    stemmer = Stemmer()
    assert stemmer.tokens("Painting, PAINTED and paints!") == ["paint", "paint", "and", "paint"]
    assert stemmer.tokens("") == []
