"""Outcome metrics over the state database, per job kind and workspace: every memory update attempt records
one outcome row (normal passes included), so counts divide into honest rates; restores come from the runs."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

from nanobotd.state.store import StateStore
from nanobotd.timestamps import iso_local

OUTCOMES = ("written", "no_change", "guard_rejected", "raw_fallback", "error")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
TOP_REASONS = 5
REASON_KEYS = {"guard_rejected": "guard_reasons", "raw_fallback": "fallback_reasons", "error": "error_reasons"}
RESTORE_KIND = "restore"
RESTORED_OUTCOME = "restored"
FLUSH_KIND = "flush"
MISSED_OUTCOME = "missed"  # a compaction cycle that ended with its flush tried and never done


def parse_since(text: str) -> float:
    """Seconds in a duration like "30m", "12h", "7d" or "2w"; ValueError for anything else."""
    match = DURATION.match(text or "")
    if not match:
        raise ValueError(f"bad duration {text!r}: use a number and a unit, e.g. 30m, 12h, 7d or 2w")
    return float(match.group(1)) * DURATION_UNITS[match.group(2).lower()]


@dataclass
class _Group:
    """Running totals of one (kind, workspace)."""

    counts: Counter = field(default_factory=Counter)
    tokens: int = 0
    latencies: list[float] = field(default_factory=list)
    reasons: dict[str, Counter] = field(default_factory=lambda: {outcome: Counter() for outcome in REASON_KEYS})
    restored: int = 0
    missed: int = 0

    def add(self, outcome: str, reason: str, tokens: int, latency_ms: float | None) -> None:
        """Count one outcome row; a "missed" one is not an attempt, but a compaction that came with no flush done."""
        if outcome == MISSED_OUTCOME:
            self.missed += 1
            return
        self.counts[outcome] += 1
        self.tokens += tokens or 0
        if latency_ms is not None:
            self.latencies.append(float(latency_ms))
        if outcome in self.reasons:
            self.reasons[outcome][reason or "(no reason given)"] += 1

    def to_json(self, kind: str, workspace: str) -> dict:
        """The report row of this group."""
        total = sum(self.counts.values())
        other = total - sum(self.counts[outcome] for outcome in OUTCOMES)
        latencies = sorted(self.latencies)
        return {"kind": kind, "workspace": workspace, "total": total,
                **{outcome: self.counts[outcome] for outcome in OUTCOMES}, **({"other": other} if other else {}),
                "rates": {outcome: (self.counts[outcome] / total if total else 0.0) for outcome in OUTCOMES},
                "tokens": self.tokens, "latency_ms_p50": percentile(latencies, 0.50),
                "latency_ms_p95": percentile(latencies, 0.95),
                **{key: dict(self.reasons[outcome].most_common(TOP_REASONS)) for outcome, key in REASON_KEYS.items()},
                "restored": self.restored, "missed_before_compaction": self.missed}


def percentile(ordered: list[float], fraction: float) -> float | None:
    """Linear-interpolated percentile of sorted values (numpy's default); None when there are none."""
    if not ordered:
        return None
    position = (len(ordered) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize_outcomes(store: StateStore, *, since: float, now: float) -> dict:
    """Per (kind, workspace) over since..now: counts and rates per outcome, tokens, latency p50/p95, top reasons,
    runs restored."""
    groups: dict[tuple[str, str], _Group] = {}
    # a restore's marker row is not an update attempt: restores are counted from the runs
    rows = store.query(
        "SELECT kind, workspace, outcome, reason, tokens, latency_ms FROM outcomes"
        " WHERE at >= ? AND at <= ? AND outcome != ? ORDER BY id",
        (since, now, RESTORED_OUTCOME),
    )
    for kind, workspace, outcome, reason, tokens, latency_ms in rows:
        groups.setdefault((kind, workspace), _Group()).add(outcome, reason, tokens, latency_ms)
    restores = _restores(store, since, now)
    for key, count in restores.pop("by_row").items():
        groups.setdefault(key, _Group()).restored = count
    return {
        "since": iso_local(since),
        "now": iso_local(now),
        "rows": [group.to_json(kind, workspace) for (kind, workspace), group in sorted(groups.items())],
        "restores": restores,
    }


def _restores(store: StateStore, since: float, now: float) -> dict:
    """The window's restore runs by outcome and by kind undone, and the finished ones by (kind, workspace)."""
    by_row: Counter = Counter()
    by_outcome: Counter = Counter()
    by_kind: Counter = Counter()
    rows = store.query(
        "SELECT workspace, state, outcome, manifest FROM runs WHERE kind=? AND started_at >= ?"
        " AND started_at <= ? AND state NOT IN ('queued', 'started')",
        (RESTORE_KIND, since, now),
    )
    for workspace, state, outcome, manifest_text in rows:
        by_outcome[outcome or state] += 1
        if state != "finished":
            continue
        try:
            manifest = json.loads(manifest_text)
        except ValueError:
            manifest = None
        kind = _target_kind(store, manifest) if isinstance(manifest, dict) else "unknown"
        by_kind[kind] += 1
        by_row[(kind, workspace)] += 1
    return {"total": sum(by_outcome.values()), "by_outcome": dict(by_outcome), "by_kind": dict(by_kind),
            "by_row": by_row}


def _target_kind(store: StateStore, manifest: dict) -> str:
    """The kind of run a restore undid: its manifest's target_kind, else its target run's."""
    if isinstance(manifest.get("target_kind"), str):
        return manifest["target_kind"]
    target = store.get_run(manifest["target"]) if isinstance(manifest.get("target"), str) else None
    return target.kind if target is not None else "unknown"


def daily_outcomes(store: StateStore, *, since: float, now: float, workspace: str | None = None) -> list[dict]:
    """Outcome rows counted per local day, kind and outcome, oldest first: the series the web page charts."""
    rows = store.query(
        "SELECT date(at, 'unixepoch', 'localtime') AS day, kind, outcome, count(*) FROM outcomes"
        " WHERE at >= ? AND at <= ? AND (? IS NULL OR workspace = ?) AND outcome != ?"
        " GROUP BY day, kind, outcome ORDER BY day, kind, outcome",
        (since, now, workspace, workspace, RESTORED_OUTCOME),
    )
    return [{"day": day, "kind": kind, "outcome": outcome, "count": count} for day, kind, outcome, count in rows]


def record_daily_sample(store: StateStore, workspace: str, day: str, *, archived_twice: int, index_units: int,
                        index_db_bytes: int) -> None:
    """Keep *workspace*'s figures of *day* (a later sample replaces the day's), so the page charts over days what
    the daemon holds only as it is now."""
    with store.transaction() as db:
        db.execute(
            "INSERT INTO daily_samples (workspace, day, archived_twice, index_units, index_db_bytes, at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (workspace, day) DO UPDATE SET"
            " archived_twice=excluded.archived_twice, index_units=excluded.index_units,"
            " index_db_bytes=excluded.index_db_bytes, at=excluded.at",
            (workspace, day, archived_twice, index_units, index_db_bytes, store.clock()),
        )


def daily_samples(store: StateStore, workspace: str, first_day: str) -> list[dict]:
    """*workspace*'s daily samples from *first_day* on, oldest first (none for a day the daemon did not run)."""
    rows = store.query(
        "SELECT day, archived_twice, index_units, index_db_bytes FROM daily_samples"
        " WHERE workspace = ? AND day >= ? ORDER BY day", (workspace, first_day))
    return [{"day": day, "archived_twice": twice, "index_units": units, "index_db_bytes": size}
            for day, twice, units, size in rows]


def last_outcomes(store: StateStore, workspace: str) -> dict[str, dict]:
    """The newest outcome row of each job kind in *workspace*: whether the last LLM call of each job went well."""
    rows = store.query(
        "SELECT kind, outcome, reason, at FROM outcomes WHERE id IN"
        " (SELECT max(id) FROM outcomes WHERE workspace = ? AND outcome != ? GROUP BY kind)",
        (workspace, RESTORED_OUTCOME),
    )
    return {kind: {"outcome": outcome, "reason": reason, "at": iso_local(at)} for kind, outcome, reason, at in rows}


def outcome_totals(store: StateStore) -> list[tuple[str, str, str, int]]:
    """(kind, workspace, outcome, count) over all time: the counters /metrics exposes."""
    return [tuple(row) for row in store.query(
        "SELECT kind, workspace, outcome, count(*) FROM outcomes WHERE outcome != ?"
        " GROUP BY kind, workspace, outcome ORDER BY kind, workspace, outcome", (RESTORED_OUTCOME,))]
