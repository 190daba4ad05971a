"""Offline token counting with tiktoken, using the encoding files litellm ships.

tiktoken would download its encodings; litellm carries cl100k_base, o200k_base and p50k_base, so we
point TIKTOKEN_CACHE_DIR at them before the first get_encoding. litellm itself is never imported here.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import itertools
import os
import queue
import sys
import threading
import time
from pathlib import Path

from nanobotd import heap

DEFAULT_ENCODING = "o200k_base"
AGENT_ENCODING = "cl100k_base"  # what nanobot counts its prompt in
CL100K_MODEL_HINTS = ("gpt-4-", "gpt-4", "gpt-3.5", "text-embedding", "claude")
# Counting text far larger than any context window only tells us "huge"; cap the work it costs.
MAX_COUNTED_CHARS = 4_000_000
BATCH_THREADS = 4
MIN_TEXTS_PER_THREAD = 64


def encoding_name_for(model: str) -> str:
    """o200k_base for current models; cl100k_base for the older ones that use it."""
    lowered = model.lower().split("/")[-1]
    if lowered.startswith(("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4")):
        return DEFAULT_ENCODING
    if lowered.startswith(CL100K_MODEL_HINTS):
        return "cl100k_base"
    return DEFAULT_ENCODING


def workspace_encoding(mode: str, model: str) -> str:
    """What a workspace counts in: beside nanobot (companion, or auto), as nanobot counts its prompt (cl100k); an
    owner, for its own model."""
    return encoding_name_for(model) if mode == "owner" else AGENT_ENCODING


def tokenizer_dir() -> Path | None:
    """The folder of encoding files inside the installed litellm package, found without importing it."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
    return folder if folder.is_dir() else None


@functools.lru_cache(maxsize=4)
def get_encoding(name: str = DEFAULT_ENCODING):
    """A cached tiktoken encoding, loaded from litellm's bundled files (no network)."""
    folder = tokenizer_dir()
    if folder is not None and "TIKTOKEN_CACHE_DIR" not in os.environ:
        os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    import tiktoken

    encoding = tiktoken.get_encoding(name)
    # tiktoken keeps the encoding's merge ranks twice: in its Rust core, which encodes, and as a Python dict
    # (~200k bytes keys, ~26 MB for o200k_base) that only pickling an encoding reads. Encodings are never
    # pickled here (counting threads share this one), so the dict goes.
    if isinstance(getattr(encoding, "_mergeable_ranks", None), dict):
        encoding._mergeable_ranks = {}
        gc.collect()
    return encoding


class _Usage:
    """When an encoding was last used (a loaded encoding costs ~70 MB; idle daemons give it back)."""

    last_used = 0.0


def count_tokens(text: str, encoding_name: str = DEFAULT_ENCODING) -> int:
    """Exact token count of *text*; text beyond MAX_COUNTED_CHARS is estimated at 4 chars a token."""
    if not text:
        return 0
    _Usage.last_used = time.monotonic()
    encoding = get_encoding(encoding_name)
    if len(text) <= MAX_COUNTED_CHARS:
        return len(encoding.encode(text, disallowed_special=()))
    head = len(encoding.encode(text[:MAX_COUNTED_CHARS], disallowed_special=()))
    return head + (len(text) - MAX_COUNTED_CHARS) // 4


def count_tokens_batch(texts: list[str], encoding_name: str = DEFAULT_ENCODING) -> list[int]:
    """count_tokens of each of *texts*; a large batch is counted by the calling thread and the counting
    threads together (tiktoken encodes without the GIL)."""
    if not texts:
        return []
    _Usage.last_used = time.monotonic()
    encoding = get_encoding(encoding_name)
    threads = max(1, min(BATCH_THREADS, os.cpu_count() or 1, len(texts) // MIN_TEXTS_PER_THREAD))
    if threads == 1:
        return [count_text(encoding, text) for text in texts]
    batch = PendingCounts(encoding, texts)
    _hand_over(batch, threads - 1)
    return batch.result()


def submit_tokens_batch(texts: list[str], encoding_name: str = DEFAULT_ENCODING) -> PendingCounts:
    """count_tokens_batch of *texts*, counted by a counting thread while the caller goes on (a scan parses
    the next lines meanwhile)."""
    _Usage.last_used = time.monotonic()
    batch = PendingCounts(get_encoding(encoding_name), texts)
    _hand_over(batch, 1)
    return batch


def count_text(encoding, text: str) -> int:
    """The exact count of the text's first MAX_COUNTED_CHARS, plus 4 chars a token beyond them."""
    return len(encoding.encode_ordinary(text[:MAX_COUNTED_CHARS])) + max(0, len(text) - MAX_COUNTED_CHARS) // 4


class PendingCounts:
    """The counts of a batch of texts, each text counted by whichever thread takes it first: the counting
    threads, and the caller of result(), which counts what is left instead of waiting for it."""

    def __init__(self, encoding, texts: list[str]) -> None:
        self._encoding = encoding
        self._texts = texts
        self._counts = [0] * len(texts)
        self._next = itertools.count()  # the next text to take (next() on it is atomic under the GIL)
        self._counting = 0
        self._finished = threading.Condition()
        self._error: BaseException | None = None

    def result(self) -> list[int]:
        """Every text's count, once the texts taken by other threads are counted; raises what counting
        raised in any thread."""
        self._count_left()
        with self._finished:
            self._finished.wait_for(lambda: self._counting == 0)
        if self._error is not None:
            raise self._error
        return self._counts

    def count_in_thread(self) -> None:
        """Count texts until none is left, in a counting thread: a failure is kept for result() to raise."""
        try:
            self._count_left()
        except BaseException as exc:  # raised by result() in the thread that wants the counts
            self._error = exc

    def _count_left(self) -> None:
        with self._finished:
            self._counting += 1
        try:
            while (index := next(self._next)) < len(self._texts):
                self._counts[index] = count_text(self._encoding, self._texts[index])
        finally:
            with self._finished:
                self._counting -= 1
                self._finished.notify_all()


class _CountingThreads:
    """A few daemon threads that count the batches handed to them, in the order given.

    Started on the first batch large enough to share, stopped with the encodings (release_if_idle): an idle
    daemon keeps no counting thread.
    """

    lock = threading.Lock()
    running: _CountingThreads | None = None

    def __init__(self, size: int) -> None:
        self.jobs: queue.SimpleQueue[PendingCounts | None] = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._work, name=f"tokens-{n}", daemon=True) for n in range(size)]
        for thread in self.threads:
            thread.start()

    def _work(self) -> None:
        while (batch := self.jobs.get()) is not None:
            batch.count_in_thread()

    def stop(self) -> None:
        """Let the threads finish the batches already handed over, then end them."""
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join()


def _hand_over(batch: PendingCounts, threads: int) -> None:
    """Let *threads* counting threads count *batch* (starting them if none is running)."""
    with _CountingThreads.lock:  # queued before a stop's end markers, or to threads started after it
        if _CountingThreads.running is None:
            _CountingThreads.running = _CountingThreads(min(BATCH_THREADS, os.cpu_count() or 1))
        for _ in range(threads):
            _CountingThreads.running.jobs.put(batch)


def counting_threads() -> int:
    """How many counting threads are running (none until a batch needs them, none once released)."""
    running = _CountingThreads.running
    return sum(thread.is_alive() for thread in running.threads) if running is not None else 0


def _stop_counting_threads() -> None:
    with _CountingThreads.lock:
        running, _CountingThreads.running = _CountingThreads.running, None
    if running is not None:
        running.stop()


def _forget_counting_threads() -> None:
    """A forked child has none of its parent's threads: start its own when it needs them."""
    _CountingThreads.lock = threading.Lock()
    _CountingThreads.running = None


os.register_at_fork(after_in_child=_forget_counting_threads)


def encodings_loaded() -> bool:
    """An encoding is in memory."""
    return get_encoding.cache_info().currsize > 0


def release_if_idle(idle_seconds: float) -> bool:
    """Drop loaded encodings and the counting threads unused for *idle_seconds*; give the memory back."""
    if not encodings_loaded() or time.monotonic() - _Usage.last_used < idle_seconds:
        return False
    _stop_counting_threads()
    get_encoding.cache_clear()
    registry = sys.modules.get("tiktoken.registry")
    if registry is not None:
        registry.ENCODINGS.clear()
    gc.collect()
    heap.trim()
    return True
