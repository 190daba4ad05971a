"""Offline token counting with tiktoken, using the encoding files litellm ships.

tiktoken would download its encodings; litellm carries cl100k_base, o200k_base and p50k_base, so we
point TIKTOKEN_CACHE_DIR at them before the first get_encoding. litellm itself is never imported here.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import importlib.util
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_ENCODING = "o200k_base"
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

    return tiktoken.get_encoding(name)


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
    """count_tokens of each of *texts*; a large batch is split over up to BATCH_THREADS threads (tiktoken
    encodes without the GIL), one slice of texts each."""
    if not texts:
        return []
    _Usage.last_used = time.monotonic()
    encoding = get_encoding(encoding_name)
    heads = [text[:MAX_COUNTED_CHARS] for text in texts]

    def count(part: list[str]) -> list[int]:
        return [len(encoding.encode_ordinary(text)) for text in part]

    threads = max(1, min(BATCH_THREADS, os.cpu_count() or 1, len(heads) // MIN_TEXTS_PER_THREAD))
    if threads == 1:
        counts = count(heads)
    else:
        size = -(-len(heads) // threads)
        with ThreadPoolExecutor(threads, thread_name_prefix="tokens") as pool:
            counts = [n for part in pool.map(count, [heads[i:i + size] for i in range(0, len(heads), size)])
                      for n in part]
    return [n + max(0, len(text) - MAX_COUNTED_CHARS) // 4 for n, text in zip(counts, texts, strict=True)]


def encodings_loaded() -> bool:
    """An encoding is in memory."""
    return get_encoding.cache_info().currsize > 0


def release_if_idle(idle_seconds: float) -> bool:
    """Drop loaded encodings unused for *idle_seconds* and return the memory to the system."""
    if not encodings_loaded() or time.monotonic() - _Usage.last_used < idle_seconds:
        return False
    get_encoding.cache_clear()
    registry = sys.modules.get("tiktoken.registry")
    if registry is not None:
        registry.ENCODINGS.clear()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return True
