"""nanobotd/index/vectors.py: embeddings from the fake server's /v1/embeddings, kept as int8, fused with BM25."""

from __future__ import annotations

import pytest

from nanobotd.config.schema import LLMSettings
from nanobotd.index.builtin import BuiltinIndex
from nanobotd.index.vectors import fuse, quantize
from nanobotd.llm.embeddings import Embedder, EmbeddingError
from tests.support.fakellm import EMBEDDING_DIMENSIONS, FakeLLM, HttpError
from tests.support.llmworker import shared_worker
from tests.support.workspace import make_workspace


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


def embedder(fake: FakeLLM, dimensions: int = 0) -> Embedder:
    return Embedder("openai/fake-embed", LLMSettings(model="none", api_base=fake.base_url), dimensions=dimensions,
                    worker=shared_worker())


@pytest.fixture
def index(tmp_path, fake):
    root, sessions = make_workspace(tmp_path)
    (root / "memory" / "MEMORY.md").write_text(
        "# Memory\n\n## Hobbies\n- Dance is the go-to for stress relief.\n\n## Pets\n- The cat is called Luna.\n\n"
        "## Travel\n- The offsite is in Lisbon.\n")
    built = BuiltinIndex(root, tmp_path / "index.db", sessions, embed=embedder(fake).embed)
    yield built
    built.close()


def test_units_are_embedded_at_refresh_and_kept_as_one_byte_per_dimension(index, fake):
    report = index.refresh()
    assert report["units_embedded"] == index.stats()["units"] == index.stats()["embeddings"]["vectors"] > 3
    codes = index._conn().execute("SELECT code FROM vectors").fetchall()
    assert {len(code) for (code,) in codes} == {EMBEDDING_DIMENSIONS}
    assert index.refresh()["units_embedded"] == 0  # nothing new: the model is not asked again


def test_the_vector_half_finds_what_whole_words_miss_and_lexical_hits_keep_their_place(index):
    index.refresh()
    assert "stress relief" in index.search("destress")[0].text  # no word in common, pieces of words
    hits = index.search("Luna cat")
    assert "Luna" in hits[0].text and 0 < hits[0].score <= 1


def test_a_failing_model_leaves_bm25_answering_and_says_why(index, fake):
    fake.embeddings_error = HttpError(500, '{"error": {"message": "model melted"}}')
    report = index.refresh()
    assert report["units_embedded"] == 0
    assert "Luna" in index.search("Luna")[0].text
    status = index.stats()["embeddings"]
    assert status["resting"] and "embedding units failed" in status["last_error"]


def test_embedder_errors_are_its_own_and_off_means_off(fake):
    fake.embeddings_error = HttpError(401, '{"error": {"message": "bad key"}}')
    with pytest.raises(EmbeddingError):
        embedder(fake).embed(["x"])
    assert not Embedder("none", LLMSettings()).enabled


def test_quantized_codes_and_rank_fusion():
    assert quantize([3.0, 4.0]) == bytes([76, 102])  # 0.6 and 0.8 of 127
    assert fuse([1, 2, 3], [3, 4]) == [3, 1, 2, 4]
