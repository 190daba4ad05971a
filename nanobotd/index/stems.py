"""Words reduced to the stems FTS5 indexes them under, so Python-side scoring agrees with the index. Unknown words
go through the index's own tokenizer in an in-memory FTS5 table (a Python Porter would drift), and are remembered."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable

from nanobotd.index.ftsdb import TOKENIZER

# unicode61 separates on everything that is not a letter or a number (the underscore included).
TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
CACHE_SIZE = 200_000
BATCH = 500


class Stemmer:
    """Maps words to FTS5 stems, with a bounded cache; safe to share between threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._cache: dict[str, str] = {}
        self._connection = sqlite3.connect(":memory:", check_same_thread=False)
        self._connection.execute(f"CREATE VIRTUAL TABLE probe USING fts5(word, tokenize='{TOKENIZER}')")
        self._connection.execute("CREATE VIRTUAL TABLE probe_terms USING fts5vocab(probe, 'instance')")

    def stems(self, words: Iterable[str]) -> list[str]:
        """The stem of each word, in order ("" for a word the tokenizer drops)."""
        words = list(words)
        missing = [word for word in dict.fromkeys(words) if word not in self._cache]
        if missing:
            self._learn(missing)
        return [self._cache.get(word, "") for word in words]

    def tokens(self, text: str) -> list[str]:
        """The stems of every word of *text*, in order (what FTS5 would index)."""
        return [stem for stem in self.stems(word.lower() for word in TOKEN.findall(text)) if stem]

    def _learn(self, words: list[str]) -> None:
        with self._lock:
            if len(self._cache) + len(words) > CACHE_SIZE:
                self._cache.clear()
            for offset in range(0, len(words), BATCH):
                batch = words[offset:offset + BATCH]
                connection = self._connection
                connection.execute("DELETE FROM probe")
                connection.executemany("INSERT INTO probe (rowid, word) VALUES (?, ?)", enumerate(batch))
                found: dict[int, str] = {}
                for term, row in connection.execute("SELECT term, doc FROM probe_terms WHERE col = 'word'"):
                    found.setdefault(row, term)  # a word the tokenizer splits keeps its first part
                for row, word in enumerate(batch):
                    self._cache[word] = found.get(row, "")
