"""The reranker's word finder: whole words starting with a query prefix, each occurrence once."""

from __future__ import annotations

from nanobotd.index.ranking import highlighter, make_snippet
from nanobotd.index.rerank import find_words


def test_words_are_found_at_word_starts_only_and_each_occurrence_once():
    text = "painting, paints and repaint; unpaint_ed paint. painter's (painted)"
    found = find_words(text, ("painter", "paint"))
    assert sorted(found) == sorted(["painting", "paints", "paint", "painter", "painted"])
    assert find_words("kestrel kestrel-kestrel", ("kestr",)) == ["kestrel", "kestrel", "kestrel"]
    assert find_words("nothing here", ("kestr",)) == []


def test_the_snippet_is_the_line_with_most_query_words_cut_around_the_first():
    text = "first line without them\n" + "x " * 200 + "the kestrel flew over the budget meeting\nkestrel alone"
    snippet = make_snippet(text, highlighter(["kestrel", "budget"]))
    assert "kestrel flew over the budget" in snippet and snippet.startswith("…")
    assert make_snippet("no words here", highlighter([])) == "no words here"
