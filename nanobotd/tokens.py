"""Token counts: a byte estimate everywhere, exact tiktoken counts only where a decision needs them. The exact ones use
the encodings litellm ships, read from its folder without importing it or touching tiktoken's cache or the environment.
"""

from __future__ import annotations

import base64
import functools
import gc
import hashlib
import importlib.util
import time
from pathlib import Path

from nanobotd import heap
from nanobotd.tuning import ESTIMATE_BYTES_PER_TOKEN, MAX_COUNTED_CHARS

DEFAULT_ENCODING = "o200k_base"
AGENT_ENCODING = "cl100k_base"  # what nanobot counts its prompt in
CL100K_MODEL_HINTS = ("gpt-4-", "gpt-4", "gpt-3.5", "text-embedding", "claude")
ENCODING_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"  # litellm names its copy by sha1
# tiktoken_ext.openai_public's patterns and special tokens (its constructors would fetch the ranks themselves)
_CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                   r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
_O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+""",
])
_SHAPES = {
    "cl100k_base": (_CL100K_PATTERN, {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                                      "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}),
    "o200k_base": (_O200K_PATTERN, {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}),
}


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


def estimate_tokens(text: str) -> int:
    """A message's tokens estimated from its UTF-8 size: what a scan, a reconcile and raw archiving go by."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))  # ASCII: a byte a character
    return -(-size // ESTIMATE_BYTES_PER_TOKEN)


def tokenizer_dir() -> Path | None:
    """The folder of encoding files inside the installed litellm package, found without importing it."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
    return folder if folder.is_dir() else None


@functools.lru_cache(maxsize=4)
def get_encoding(name: str = DEFAULT_ENCODING):
    """A cached tiktoken encoding, built from litellm's bundled file (no network); tiktoken's own registry (which
    may download) only for an encoding litellm does not carry."""
    import tiktoken

    folder = tokenizer_dir()
    source = folder / hashlib.sha1(ENCODING_URL.format(name).encode()).hexdigest() if folder else None
    if name not in _SHAPES or source is None or not source.is_file():
        return tiktoken.get_encoding(name)
    ranks = {base64.b64decode(token): int(rank) for token, rank in
             (line.split() for line in source.read_bytes().splitlines() if line)}
    pattern, special = _SHAPES[name]
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)


class _Usage:
    """When an encoding was last used (a loaded encoding is large; idle daemons give it back)."""

    last_used = 0.0


def count_tokens(text: str, encoding_name: str = DEFAULT_ENCODING) -> int:
    """Exact token count of *text*; text beyond MAX_COUNTED_CHARS is estimated at 4 chars a token."""
    if not text:
        return 0
    _Usage.last_used = time.monotonic()
    encoding = get_encoding(encoding_name)
    head = len(encoding.encode(text[:MAX_COUNTED_CHARS], disallowed_special=()))
    return head + max(0, len(text) - MAX_COUNTED_CHARS) // 4


def encodings_loaded() -> bool:
    """An encoding is in memory."""
    return get_encoding.cache_info().currsize > 0


def release_if_idle(idle_seconds: float) -> bool:
    """Drop loaded encodings unused for *idle_seconds*; give the memory back."""
    if not encodings_loaded() or time.monotonic() - _Usage.last_used < idle_seconds:
        return False
    get_encoding.cache_clear()
    gc.collect()
    heap.trim()
    return True
