"""Typed settings, one frozen dataclass per config table, field names the TOML keys (DESIGN.md §7), so loading
is generic and a wrong key is named exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class DaemonSettings:
    """Process-wide settings: paths, logging, watcher timing."""

    socket: str = ""
    state_dir: str = ""
    log_level: str = "INFO"
    reconcile_seconds: float = 60.0
    debounce_seconds: float = 1.0
    timezone: str = ""
    job_stop_seconds: float = 20.0
    socket_group: str = ""
    parse_processes: int = 0  # a cold start's new files parsed in up to this many child processes (one per core)


@dataclass(frozen=True)
class LLMSettings:
    """The [llm] table: which model answers, and how long and how often the adapter may try."""

    model: str = "none"
    api_base: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    timeout_seconds: float = 60
    max_retries: int = 2
    concurrency: int = 2
    context_window: int = 200000
    max_tokens: int = 8192
    idle_exit_seconds: float = 300  # the LLM worker process (and litellm's memory) goes after this long unused


@dataclass(frozen=True)
class ConsolidationSettings:
    """Token-budget archiving and the pre-compaction flush (DESIGN.md §4)."""

    ratio: float = 0.5
    idle_minutes: float = 30.0
    reserve_floor: int = 20000
    soft_threshold: int = 4000
    max_rounds: int = 5
    chunk_ratio_max: float = 0.4
    chunk_ratio_min: float = 0.15
    summary_max_chars: int = 8000
    raw_max_chars: int = 16000
    flush: bool = True
    mode: str = "auto"  # "companion" beside an agent that archives by itself, "owner" otherwise (DESIGN.md §8)
    agent_grace_seconds: float = 180.0
    agent_base_tokens: int = 9000  # the agent's system prompt and tool schemas until its first compaction is seen
    flush_idle_margin_seconds: float = 120.0
    flush_retries: int = 3  # a flush whose LLM call failed is tried again this often before the compaction
    flush_retry_seconds: float = 30.0  # after the first failure; doubled after each further one


@dataclass(frozen=True)
class DreamSettings:
    """The nightly dream: schedule, batch size and the bounds of its edit loops and of one run."""

    enabled: bool = True
    schedule: str = "15 4 * * *"
    max_iterations: int = 15
    batch_entries: int = 20
    token_budget: int = 200000


@dataclass(frozen=True)
class LifecycleSettings:
    """Ageing of daily notes, archive TTL, history compaction, backup retention."""

    schedule: str = "45 4 * * *"
    active_days: int = 7
    ttl_days: int = 90
    max_history_entries: int = 1000
    restore_window_days: int = 30


@dataclass(frozen=True)
class SearchSettings:
    """Which search backend answers. Past qmd_timeout_seconds the builtin index answers (an agent waits);
    embeddings: "none" or a litellm embedding model (through [llm] api_base and key), fused with BM25."""

    backend: str = "builtin"
    qmd_command: str = "qmd"
    qmd_timeout_seconds: float = 3.0
    qmd_vectors: bool = False
    debounce_seconds: float = 2.0
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

    max_chars: int = 20000
    total_max_chars: int = 24000
    budget_tokens: int = 8000


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
