"""The workspace audit, read-only: what the next lifecycle run would do, the state of memory, and what is wrong with it,
each problem paired with the command or edit that fixes it.

Beside an agent that keeps its own memory it also checks what makes nanobotd's work reach the agent: the agent's own
dream kept out of the way, nanobotd's MCP server registered, the dream keeping up, the injected files within their caps,
and no message archived twice."""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path

from nanobotd.config.paths import MEMORY_FILES
from nanobotd.config.schema import WorkspaceSettings
from nanobotd.jobs.dreamnotes import cap_overruns, unread_note_bullets
from nanobotd.jobs.planlines import describe_step
from nanobotd.jobs.runfiles import folder_size, run_backups
from nanobotd.memory import history
from nanobotd.memory.dailynote import scan_notes
from nanobotd.memory.history import TIMESTAMP_FORMAT
from nanobotd.sessions.agent_config import AgentSettings
from nanobotd.state.store import StateStore

LIFECYCLE_COMMAND = "nanobotctl lifecycle"
LINES_SHOWN = 20
DREAM_COMMAND = "nanobotctl dream"
SETUP_COMMAND = "nanobotctl setup nanobot"
BACKLOG_MAX_AGE = timedelta(days=2)
NOTE_FIXES = (
    ("symlink", "replace the symlink with a real folder or file, or move it out of memory/"),
    ("not a folder", "move the file away and let the next `nanobotctl lifecycle` create the folder"),
    ("impossible date", "rename it to the date it is really for (YYYY-MM-DD.md)"),
    ("not valid UTF-8", "re-save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"),
    ("no ## sections", "add a `## Topics` section to it, or move it out of memory/"),
    ("not a daily note", "rename it to YYYY-MM-DD.md or move it out of memory/"),
    ("not archived", f"fix the archive folder, then run `{LIFECYCLE_COMMAND}`"),
)


def audit_workspace(ws: WorkspaceSettings, *, store: StateStore, now: datetime, lifecycle_plan: list,
                    extra_state: dict, agent: AgentSettings | None = None, companion: bool = False,
                    archived_twice: int = 0) -> dict:
    """{"name", "plan", "plan_steps", "state", "problems": [{"problem", "fix"}]} for one workspace, read-only: "plan" is
    the lifecycle dry run in readable lines, "plan_steps" its steps."""
    memory_dir = ws.path / "memory"
    history_path = history.history_path(memory_dir)
    backup_sizes = [folder_size(folder) for _, folder in run_backups(store, ws.name)]
    cursor_file = history.read_cursor_file(memory_dir / history.CURSOR_NAME)
    dream_cursor = history.read_dream_cursor(memory_dir)
    facts = scan_history(memory_dir, dream_cursor, now - BACKLOG_MAX_AGE)
    unread = unread_note_bullets(memory_dir)
    sizes = bootstrap_sizes(ws)
    state = {
        "history_entries": facts.entries,
        "history_bytes": history_path.stat().st_size if history_path.exists() else 0,
        "largest_cursor": facts.largest,
        "cursor_file": cursor_file,
        "dream_cursor": dream_cursor,
        "undreamt_entries": facts.undreamt,
        "undreamt_note_bullets": len(unread),
        "bootstrap_chars": sizes,
        "archived_twice": archived_twice,
        "backup_bytes": sum(backup_sizes),
        "backup_runs": len(backup_sizes),
        **extra_state,
    }
    problems = history_problems(facts, cursor_file, dream_cursor)
    problems += note_problems(ws)
    problems += lifecycle_problems(ws, lifecycle_plan, now)
    problems += dream_backlog_problems(ws, facts, [bullet.day for bullet in unread], now)
    problems += cap_problems(ws, sizes)
    problems += agent_problems(agent, companion)
    problems += archived_twice_problems(ws, archived_twice)
    plan = [step if isinstance(step, str) else describe_step(step) for step in lifecycle_plan]
    return {"name": ws.name, "plan": plan, "plan_steps": lifecycle_plan, "state": state, "problems": problems}


@dataclass
class HistoryFacts:
    """What the audit needs of history.jsonl, gathered in one streamed pass: counts and line numbers, no entries."""

    entries: int = 0
    largest: int = 0
    undreamt: int = 0
    old_undreamt: int = 0  # not dreamt and older than the backlog cutoff
    oldest_undreamt: date | None = None
    bad_lines: list[int] = field(default_factory=list)
    backwards: list[int] = field(default_factory=list)  # lines whose cursor is below the one before
    first_backwards: tuple[int, int, int, int] | None = None  # (cursor before, its line, cursor, line)
    duplicates: dict[int, list[int]] = field(default_factory=dict)  # cursor -> its lines, when more than one


def scan_history(memory_dir: Path, dream_cursor: int, cutoff: datetime) -> HistoryFacts:
    """Stream history.jsonl once; memory grows with its cursors (8 bytes each), never with its entries."""
    facts = HistoryFacts()
    cursors, lines = array("q"), array("q")
    previous: tuple[int, int] | None = None
    increasing = True
    for number, entry in history.iter_history(memory_dir):
        if entry is None:
            facts.bad_lines.append(number)
            continue
        facts.entries += 1
        facts.largest = max(facts.largest, entry.cursor)
        cursors.append(entry.cursor)
        lines.append(number)
        if previous is not None and entry.cursor <= previous[0]:
            increasing = False
            if entry.cursor < previous[0]:
                facts.first_backwards = facts.first_backwards or (*previous, entry.cursor, number)
                facts.backwards.append(number)
        previous = (entry.cursor, number)
        if entry.cursor > dream_cursor:
            facts.undreamt += 1
            moment = _entry_time(entry)
            if moment is not None and moment < cutoff:
                facts.old_undreamt += 1
                facts.oldest_undreamt = min(facts.oldest_undreamt or moment.date(), moment.date())
    if not increasing:  # only then can a cursor appear twice
        repeated = {cursor for cursor, count in Counter(cursors).items() if count > 1}
        for cursor, number in zip(cursors, lines, strict=True):
            if cursor in repeated:
                facts.duplicates.setdefault(cursor, []).append(number)
    return facts


def history_problems(facts: HistoryFacts, cursor_file: int, dream_cursor: int) -> list[dict]:
    """Duplicate or out-of-order cursors, unparsable lines and cursor files out of step with the history. Gaps between
    cursors are normal (compaction and restores leave them) and are not reported."""
    problems = []
    for cursor, lines in sorted(facts.duplicates.items()):
        problems.append({
            "problem": f"memory/history.jsonl holds cursor {cursor} more than once (lines {_lines(lines)})",
            "fix": f"keep one of lines {_lines(lines)} in memory/history.jsonl (merge their content by hand)",
        })
    if facts.first_backwards:
        previous_cursor, previous_line, cursor, line = facts.first_backwards
        problems.append({
            "problem": f"memory/history.jsonl is out of order: cursor {cursor} at line {line}"
                       f" follows cursor {previous_cursor} at line {previous_line}"
                       f" (lines going backwards: {_lines(facts.backwards)})",
            "fix": "sort the lines of memory/history.jsonl by cursor (keep each entry's cursor)",
        })
    if facts.bad_lines:
        problems.append({
            "problem": f"memory/history.jsonl has {len(facts.bad_lines)} unparsable line(s):"
                       f" {_lines(facts.bad_lines)}",
            "fix": "repair or delete those lines; until then nanobotd skips them and never rewrites them away",
        })
    largest = facts.largest
    allocated = max(largest, cursor_file)
    if dream_cursor > allocated:
        problems.append({
            "problem": f"memory/.dream_cursor is {dream_cursor}, ahead of the last allocated cursor {allocated}:"
                       " the next entries would never be dreamt",
            "fix": f"edit memory/.dream_cursor to {allocated}",
        })
    if cursor_file and cursor_file < largest:
        problems.append({
            "problem": f"memory/.cursor is {cursor_file}, behind the largest cursor in history.jsonl ({largest})",
            "fix": f"edit memory/.cursor to {largest}",
        })
    return problems


def note_problems(ws: WorkspaceSettings) -> list[dict]:
    """Daily notes and archive entries the lifecycle leaves alone, with how to make them usable."""
    problems = []
    for item in scan_notes(ws.path / "memory").skipped:
        fix = next((text for key, text in NOTE_FIXES if key in item["reason"]), "inspect it by hand")
        problems.append({"problem": f"{item['path']}: {item['reason']}", "fix": f"{item['path']}: {fix}"})
    return problems


def lifecycle_problems(ws: WorkspaceSettings, plan: list, now: datetime) -> list[dict]:
    """Work a nightly lifecycle should already have done (it missed at least one night)."""
    settings = ws.lifecycle
    overdue = [
        step for step in plan
        if (step.get("action") == "move" and step.get("age_days", 0) > settings.active_days + 1)
        or (step.get("action") == "delete" and step.get("age_days", 0) > settings.ttl_days + 1)
    ]
    if not overdue:
        return []
    return [{
        "problem": f"the lifecycle is behind: {len(overdue)} daily note step(s) are overdue"
                   f" as of {now.date().isoformat()}",
        "fix": f"run `{LIFECYCLE_COMMAND}` (and check the lifecycle schedule)",
    }]


def dream_backlog_problems(ws: WorkspaceSettings, facts: HistoryFacts, unread_days: list,
                           now: datetime) -> list[dict]:
    """History entries and note bullets waiting for the dream longer than BACKLOG_MAX_AGE: their facts do not
    reach SOUL.md, USER.md or MEMORY.md, so the agent does not see them."""
    cutoff = now - BACKLOG_MAX_AGE
    old_bullets = [day for day in unread_days if day < cutoff.date()]
    if not facts.old_undreamt and not old_bullets:
        return []
    oldest = min(([facts.oldest_undreamt] if facts.oldest_undreamt else []) + old_bullets)
    if ws.llm.model == "none":
        fix = f"set [llm] model (the dream needs an LLM), then run `{DREAM_COMMAND}`"
    else:
        fix = (f"run `{DREAM_COMMAND}` (it drains the backlog in batches within dream.token_budget; run it again"
               " while its run says something is left), and check that the dream schedule runs")
    return [{
        "problem": f"the dream is behind: {facts.old_undreamt} history entries and {len(old_bullets)} daily-note"
                   f" bullets not dreamt are over {BACKLOG_MAX_AGE.days} days old (the oldest from"
                   f" {oldest.isoformat()})",
        "fix": fix,
    }]


def cap_problems(ws: WorkspaceSettings, sizes: dict[str, int]) -> list[dict]:
    """SOUL.md, USER.md or MEMORY.md over its cap: nanobot injects them whole into every prompt."""
    if ws.llm.model == "none":
        fix = "shorten it by hand (merge and shorten bullets); the dream, which condenses it, needs an LLM"
    else:
        fix = f"run `{DREAM_COMMAND}`: it condenses a file over its cap first (or shorten it by hand)"
    return [{"problem": f"{line}; nanobot puts it whole into every prompt", "fix": fix}
            for line in cap_overruns(sizes, ws.context)]


def agent_problems(agent: AgentSettings | None, companion: bool) -> list[dict]:
    """What in the agent's own config keeps nanobotd's work from reaching it, or fights it."""
    if agent is None or agent.path is None:
        if not companion:
            return []
        return [{"problem": "the agent archives by itself, but its config.json was not found: its own dream and"
                            " the registration of nanobotd's MCP server cannot be checked",
                 "fix": f"set the workspace's sessions_dir to nanobot's sessions folder, or run `{SETUP_COMMAND}"
                        " --nanobot-config PATH --apply` with the config nanobot uses"}]
    setup = f"`{SETUP_COMMAND} --nanobot-config {agent.path} --apply`, then restart nanobot"
    if agent.error:
        return [{"problem": f"nanobot's config cannot be used: {agent.error}",
                 "fix": f"repair {agent.path} (nanobot cannot start with it either), then run {setup}"}]
    problems = []
    if agent.own_dream_runs:
        when = f"by cron '{agent.dream_cron}'" if agent.dream_cron else f"every {agent.dream_interval_hours} h"
        problems.append({"problem": f"nanobot's own dream runs {when} beside nanobotd's: both edit SOUL.md,"
                                    " USER.md and memory/MEMORY.md and move memory/.dream_cursor",
                         "fix": f"{setup} (it moves nanobot's dream ten years out)"})
    if not agent.dream_enabled:
        problems.append({"problem": f"dream.enabled is false in {agent.path}: nanobot then moves"
                                    " memory/.dream_cursor past entries nanobotd's dream has not read",
                         "fix": f"{setup} (it enables nanobot's dream and moves it ten years out instead)"})
    if agent.mcp_server_for() is None:
        problems.append({"problem": f"nanobotd's MCP server is not registered in {agent.path}: the agent has no"
                                    " memory_search, memory_context or memory_recall tools",
                         "fix": setup})
    return problems


def archived_twice_problems(ws: WorkspaceSettings, archived_twice: int) -> list[dict]:
    """Messages both the agent and nanobotd archived: history holds them twice (the goal is none)."""
    if not archived_twice:
        return []
    if ws.consolidation.mode == "owner":
        fix = 'set consolidation.mode = "auto" for this workspace: its agent archives by itself'
    else:
        fix = (f"raise consolidation.agent_grace_seconds (now {ws.consolidation.agent_grace_seconds:g} s) so that"
               " nanobotd waits longer for the agent's own archive entry")
    return [{"problem": f"{archived_twice} message(s) were archived twice, by the agent and by nanobotd", "fix": fix}]


def bootstrap_sizes(ws: WorkspaceSettings) -> dict[str, int]:
    """Characters of each of the files nanobot injects whole (missing ones left out)."""
    sizes = {}
    for path in MEMORY_FILES:
        try:
            sizes[path] = len((ws.path / path).read_bytes().decode("utf-8", "replace"))
        except OSError:
            continue
    return sizes


def _entry_time(entry: history.HistoryEntry) -> datetime | None:
    try:
        return datetime.strptime(entry.timestamp[:16], TIMESTAMP_FORMAT)
    except ValueError:
        return None


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(str(number) for number in numbers[:LINES_SHOWN])
    return shown + (f" and {len(numbers) - LINES_SHOWN} more" if len(numbers) > LINES_SHOWN else "")
