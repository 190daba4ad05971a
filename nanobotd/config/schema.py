"""Typed settings, one frozen dataclass per config table, field names the TOML keys (DESIGN.md §7), so loading
is generic and a wrong key is named exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DAY = 86400


def bounded(default: Any, low: float, high: float, *, exclusive: bool = False) -> Any:
    """A numeric setting with the values a running daemon can live with (from *low*, or above it if *exclusive*,
    to *high*); config loading refuses others, naming the key."""
    return field(default=default, metadata={"bounds": (low, not exclusive, high)})


def choice(default: str, choices: tuple[str, ...]) -> Any:
    """A setting with a fixed set of values (in any case); config loading refuses others, naming the key."""
    return field(default=default, metadata={"choices": choices})


@dataclass(frozen=True)
class DaemonSettings:
    """Process-wide settings: paths, logging, watcher timing."""

    socket: str = ""
    state_dir: str = ""
    log_level: str = choice("INFO", ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"))
    reconcile_seconds: float = bounded(60.0, 1, DAY)
    debounce_seconds: float = bounded(1.0, 0, 3600, exclusive=True)
    timezone: str = ""
    job_stop_seconds: float = bounded(20.0, 0, 3600, exclusive=True)
    socket_group: str = ""
    parse_processes: int = bounded(0, 0, 16)  # a cold start's new files parsed in this many children


@dataclass(frozen=True)
class LLMSettings:
    """The [llm] table: which model answers, and how long and how often the adapter may try."""

    model: str = "none"
    api_base: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    timeout_seconds: float = bounded(60, 0, 3600, exclusive=True)
    max_retries: int = bounded(2, 0, 20)
    concurrency: int = bounded(2, 1, 64)
    context_window: int = bounded(200000, 1, 100_000_000)
    max_tokens: int = bounded(8192, 1, 100_000_000)
    idle_exit_seconds: float = bounded(300, 1, DAY)  # the LLM worker (and litellm's memory) goes when unused


@dataclass(frozen=True)
class ConsolidationSettings:
    """Token-budget archiving and the pre-compaction flush (DESIGN.md §4)."""

    ratio: float = 0.5
    idle_minutes: float = bounded(30.0, 0, 365*24*60, exclusive=True)
    reserve_floor: int = bounded(20000, 0, 100_000_000)
    soft_threshold: int = bounded(4000, 0, 100_000_000)
    max_rounds: int = bounded(5, 1, 1000)
    chunk_ratio_max: float = bounded(0.4, 0, 1, exclusive=True)
    chunk_ratio_min: float = bounded(0.15, 0, 1, exclusive=True)
    summary_max_chars: int = bounded(8000, 100, 64_000)
    raw_max_chars: int = bounded(16000, 1000, 64_000)
    flush: bool = True
    mode: str = choice("auto", ("auto", "companion", "owner"))  # companion: beside an agent that archives (§8)
    agent_grace_seconds: float = bounded(180.0, 0, DAY)
    agent_base_tokens: int = bounded(9000, 0, 100_000_000)  # the agent's prompt and tools until a compaction says
    flush_idle_margin_seconds: float = bounded(120.0, 0, DAY)
    flush_retries: int = 3  # a flush whose LLM call failed is tried again this often before the compaction
    flush_retry_seconds: float = 30.0  # after the first failure; doubled after each further one


@dataclass(frozen=True)
class DreamSettings:
    """The nightly dream: schedule, batch size and the bounds of its edit loops and of one run."""

    enabled: bool = True
    schedule: str = "15 4 * * *"
    max_iterations: int = bounded(15, 1, 1000)
    batch_entries: int = bounded(20, 1, 10_000)
    token_budget: int = bounded(200000, 1, 1_000_000_000)


@dataclass(frozen=True)
class LifecycleSettings:
    """Ageing of daily notes, archive TTL, history compaction, backup retention."""

    schedule: str = "45 4 * * *"
    active_days: int = bounded(7, 0, 36_500)
    ttl_days: int = bounded(90, 0, 36_500)
    max_history_entries: int = bounded(1000, 1, 100_000_000)
    restore_window_days: int = bounded(30, 0, 36_500)


@dataclass(frozen=True)
class SearchSettings:
    """Which search backend answers. Past qmd_timeout_seconds the builtin index answers (an agent waits);
    embeddings: "none" or a litellm embedding model (through [llm] api_base and key), fused with BM25."""

    backend: str = choice("builtin", ("builtin", "qmd", "both"))
    qmd_command: str = "qmd"
    qmd_timeout_seconds: float = bounded(3.0, 0, 3600, exclusive=True)
    qmd_vectors: bool = False
    debounce_seconds: float = bounded(2.0, 0, 3600, exclusive=True)
    min_score: float = 0.0
    embeddings: str = "none"
    embedding_dimensions: int = 0


@dataclass(frozen=True)
class QmdSettings:
    """How the qmd executable is driven, from the search.qmd_* keys. vectors: `qmd embed` and vsearch/query
    (local models); mcp_server: BM25 searches from one long-lived `qmd mcp --http` child."""

    command: str = "qmd"
    timeout_seconds: float = 3.0
    start_timeout_seconds: float = 30.0
    debounce_seconds: float = 2.0
    vectors: bool = False
    mcp_server: bool = True


@dataclass(frozen=True)
class ContextSettings:
    """Caps of the budgeted memory context handed to agents."""

    max_chars: int = bounded(20000, 1, 10_000_000)
    total_max_chars: int = bounded(24000, 1, 10_000_000)
    budget_tokens: int = bounded(8000, 1, 10_000_000)


# Tables that may be overridden per workspace, with their dataclass.
WORKSPACE_TABLES = {
    "llm": LLMSettings,
    "consolidation": ConsolidationSettings,
    "dream": DreamSettings,
    "lifecycle": LifecycleSettings,
    "search": SearchSettings,
    "context": ContextSettings,
}


@dataclass(frozen=True)
class WorkspaceSettings:
    """One managed workspace with its effective (global + override) settings."""

    path: Path
    name: str
    sessions_dir: Path | None = None
    llm: LLMSettings = field(default_factory=LLMSettings)
    consolidation: ConsolidationSettings = field(default_factory=ConsolidationSettings)
    dream: DreamSettings = field(default_factory=DreamSettings)
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    context: ContextSettings = field(default_factory=ContextSettings)
    api_key: str | None = field(default=None, repr=False, compare=False)

    @property
    def budget(self) -> int:
        """Tokens of unarchived tail that trigger consolidation (as nanobot)."""
        return max(1, self.llm.context_window - self.llm.max_tokens - 1024)

    @property
    def flush_threshold(self) -> int:
        """Tokens of unarchived tail that trigger the pre-compaction memory flush."""
        return max(1, self.llm.context_window - self.consolidation.reserve_floor - self.consolidation.soft_threshold)
