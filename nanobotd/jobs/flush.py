"""The pre-compaction memory flush: durable facts of a session's unarchived tail into today's daily note. Best-effort:
consolidation archives the same messages anyway, so an LLM failure or odd reply writes nothing, the run says why."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import date, datetime
from pathlib import Path
from typing import Any

from nanobotd import fsio
from nanobotd.config.schema import WorkspaceSettings
from nanobotd.jobs.env import JobEnv, end_run, note_progress
from nanobotd.jobs.errors import RestoreRefused
from nanobotd.jobs.job import Job, QueuePolicy
from nanobotd.jobs.runfiles import digest, read_or_none, write_or_delete
from nanobotd.llm.client import LLMClient
from nanobotd.llm.failures import LLMError
from nanobotd.llm.reply import UsageMeter
from nanobotd.memory import history
from nanobotd.memory.dailynote import (
    ARCHIVE_DIR_NAME,
    NOTE_SECTIONS,
    DailyNote,
    NoteError,
    decode_note,
    drop_empty_sections,
    heading_key,
    merge_bullets,
    new_note,
    normalise_bullet,
    note_date,
    note_path,
    remove_bullets,
)
from nanobotd.memory.transcript import PendingMessage, render_message
from nanobotd.state.store import RunRecord, StateStore
from nanobotd.tokens import count_tokens, encoding_name_for
from nanobotd.tuning import CHARS_PER_TOKEN, INPUT_SHARE

FLUSH_KIND = "flush"
NO_REPLY = "NO_REPLY"
REPLY_MAX_TOKENS = 2048
KNOWN_BULLETS_MAX_CHARS = 4000
BACKUP_NAME = "note.before.md"
WRITE_ATTEMPTS = 3  # a note the agent rewrites again and again while a flush merges into it fails the flush
EMPTY_BULLETS = frozenset({"none", "(none)", "n/a", "nothing", "(nothing)", "-"})
HEADING = re.compile(r"^\s*(?:#{1,6}\s*|\*\*)(?P<name>[^#*:]+?)\s*:?\s*(?:\*\*)?\s*:?\s*$")

FLUSH_PROMPT = f"""You keep an agent's daily notes. Read the conversation transcript and extract only the \
durable facts worth remembering once the conversation is gone: decisions taken, the user's preferences and \
constraints, questions still open, and notable tool activity (what was run or changed, and with what result).

Answer in exactly these four sections, each a list of "- " bullets, one short self-contained fact per bullet:

## Topics
## Decisions
## Tool Activity
## Open Questions

Put preferences and constraints under Decisions. Leave a section empty when it has nothing. Skip small talk, \
greetings and facts already listed as known. If nothing is worth keeping, answer exactly {NO_REPLY}."""


class FlushReplyError(ValueError):
    """The model answered neither NO_REPLY nor bullets under the four sections."""


async def flush_session(
    ws: WorkspaceSettings,
    messages: list[PendingMessage],
    *,
    session_key: str,
    llm: LLMClient,
    store: StateStore,
    run_id: str,
    now: datetime,
    on_journalled: Callable[[], None] | None = None,
) -> dict:
    """Extract durable facts from *messages* into the note of *now*'s date; returns the run's manifest."""
    day = now.date()
    note = note_path(ws.path / "memory", day)
    manifest = {
        "session": session_key,
        "messages": [messages[0].digest, messages[-1].digest, len(messages)] if messages else [None, None, 0],
        "note": str(note),
        "backup": None,
        "added_bullets": {},
        "tokens": {},
    }
    meter = UsageMeter()

    def _end(outcome: str, reason: str) -> dict:
        return end_run(store, FLUSH_KIND, ws.name, run_id, manifest, outcome, reason, meter=meter)

    conversation = [message for message in messages if not message.record.get("_command")]
    if not conversation:
        return _end("no_change", "no conversation to flush")
    if llm.offline:
        return _end("no_change", "offline: the flush needs an LLM")
    known = _known_bullets(note)
    prompt = build_prompt(conversation, day, known, llm)
    manifest["sent"] = prompt.pop("sent")
    note_progress(manifest, f"asking the LLM for durable facts in {len(conversation)} messages")
    store.journal(run_id, manifest)
    try:
        reply = await llm.complete(prompt["messages"], max_tokens=REPLY_MAX_TOKENS, temperature=0.0)
    except LLMError as exc:
        meter.add_error(exc)
        manifest["llm_failed"] = True  # the cycle's flush is still owed: `run` has it tried again
        return _end("error", f"LLM failed: {exc}")
    meter.add(reply)
    try:
        facts = parse_facts(reply.content)
    except FlushReplyError as exc:
        return _end("error", str(exc))
    if facts is None:
        return _end("no_change", NO_REPLY)
    try:
        written = write_facts(note, day, facts, manifest, store=store, run_id=run_id,
                              on_journalled=on_journalled)
    except (NoteError, OSError) as exc:
        return _end("error", f"note not written: {exc}")
    outcome, reason = ("written", "") if written else ("no_change", "every fact was already in the note")
    return _end(outcome, reason)


def build_prompt(messages: list[PendingMessage], day: date, known: str, llm: LLMClient) -> dict:
    """The chat messages for the flush call, the transcript cut to the newest messages that fit."""
    encoding = encoding_name_for(llm.settings.model)
    preamble = f"Today is {day.isoformat()}.\n"
    if known:
        preamble += f"\nAlready in today's note (do not repeat):\n{known}\n"
    overhead = count_tokens(FLUSH_PROMPT + preamble, encoding) + 64
    budget = max(256, int(llm.settings.context_window * INPUT_SHARE) - overhead)
    text, sent = fit_transcript(messages, budget, encoding)
    user = f"{preamble}\nTranscript ({sent} of {len(messages)} messages, oldest first):\n\n{text}"
    return {"messages": [{"role": "system", "content": FLUSH_PROMPT}, {"role": "user", "content": user}],
            "sent": sent}


def fit_transcript(messages: list[PendingMessage], budget_tokens: int, encoding: str) -> tuple[str, int]:
    """The newest messages whose rendered lines fit *budget_tokens*; a lone oversized newest one is cut."""
    lines: list[str] = []
    used = 0
    for message in reversed(messages):
        line = render_message(message, max_chars=budget_tokens * CHARS_PER_TOKEN)
        cost = count_tokens(line, encoding) + 1
        if used + cost > budget_tokens:
            if not lines:
                lines.append(_cut_to_tokens(line, budget_tokens, encoding))
            break
        lines.append(line)
        used += cost
    lines.reverse()
    return "\n".join(lines), len(lines)


def _cut_to_tokens(text: str, budget_tokens: int, encoding: str) -> str:
    tokens = count_tokens(text, encoding)
    while tokens > budget_tokens and text:
        text = text[: int(len(text) * budget_tokens / tokens * 0.95)]
        tokens = count_tokens(text, encoding)
    return text + " ... (cut)"


def parse_facts(reply: str) -> dict[str, list[str]] | None:
    """Bullets per canonical section, or None for NO_REPLY; FlushReplyError when neither is found."""
    text = history.THINK_BLOCK.sub("", reply).strip()
    if text.strip("`'\". \n") == NO_REPLY:
        return None
    canonical = {heading_key(name): name for name in NOTE_SECTIONS}
    facts: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        heading = HEADING.match(line) if not line.lstrip().startswith(("- ", "* ", "+ ")) else None
        if heading:
            current = canonical.get(heading_key(heading.group("name")))
            continue
        stripped = line.strip()
        if current and stripped.startswith(("- ", "* ", "+ ")):
            bullet = stripped[2:].strip()
            if bullet and normalise_bullet(bullet) not in EMPTY_BULLETS:
                facts.setdefault(current, []).append(bullet)
    if facts:
        return facts
    if NO_REPLY in text:
        return None
    raise FlushReplyError(f"bad reply: no bullets under the four sections ({text[:80]!r})")


def write_facts(note: Path, day: date, facts: dict[str, list[str]], manifest: dict, *,
                store: StateStore, run_id: str, on_journalled: Callable[[], None] | None = None) -> bool:
    """Merge *facts* into the note, journaling backup and additions first; False when nothing was new. The agent writes
    the note in place without our lock, so one changed since our read is merged again: its edit is never replaced."""
    # The history lock doubles as the memory folder's write lock, so two flushes never interleave.
    root = history.workspace_root(note.parent)
    with fsio.file_lock(note.parent / history.LOCK_NAME, timeout=history.LOCK_TIMEOUT, root=root):
        for _ in range(WRITE_ATTEMPTS):
            if note.is_symlink():
                raise NoteError(f"{note.name} is a symlink; left alone")
            before = read_or_none(note)
            parsed = decode_note(before, note.name) if before is not None else new_note(day)
            missing = {name for name in NOTE_SECTIONS if parsed.section(name) is None}
            added = {}
            for section in NOTE_SECTIONS:
                new = merge_bullets(parsed, section, facts.get(section, []))
                if new:
                    added[section] = new
            if not added:
                return False
            after = parsed.render().encode("utf-8")
            if before is not None:
                backup = store.run_dir(run_id) / BACKUP_NAME
                fsio.atomic_write(backup, before, mode=0o600)
                manifest["backup"] = str(backup)
            manifest["added_bullets"] = added
            manifest["created_sections"] = [name for name in added if name in missing]
            manifest["before_sha256"] = digest(before) if before is not None else None
            manifest["after_sha256"] = digest(after)
            fsio.confine(note, root)
            store.journal(run_id, manifest)
            if on_journalled is not None:
                on_journalled()
            if read_or_none(note) == before:
                fsio.atomic_write(note, after, root=root)
                return True
        raise NoteError(f"{note.name} kept changing while the facts were merged into it")


def _known_bullets(note: Path) -> str:
    try:
        parsed = decode_note(note.read_bytes(), note.name)
    except (OSError, NoteError):
        return ""
    lines = [f"- {bullet}" for section in NOTE_SECTIONS for bullet in parsed.bullets(section)]
    return "\n".join(lines)[:KNOWN_BULLETS_MAX_CHARS]


# -- restore -------------------------------------------------------------------------------------------


def restore_flush_run(run: RunRecord, *, dry_run: bool) -> dict:
    """Undo a flush: the note's previous bytes when it is unchanged since, else only the bullets it added. Returns
    {"run_id", "plan": [lines], "files": [paths changed], "action"}; raises RestoreRefused."""
    manifest = run.manifest
    note = Path(manifest["note"]) if manifest.get("added_bullets") and manifest.get("note") else None
    try:
        current = note.read_bytes() if note is not None else None
    except FileNotFoundError:
        note = note.parent / ARCHIVE_DIR_NAME / note.name  # the lifecycle moved it inside the restore window
        try:
            current = note.read_bytes()
        except FileNotFoundError:
            return {"run_id": run.run_id, "plan": [f"{manifest['note']} no longer exists; nothing to undo"],
                    "files": [], "action": "none"}
    if current is None:
        action, content, line = "none", None, f"flush run {run.run_id} wrote nothing; nothing to restore"
    elif digest(current) == manifest.get("after_sha256"):
        action, content, line = _exact_undo(note, manifest)
    else:
        action, content, line = _bullet_removal(note, current, manifest)
    if not dry_run and action != "none":
        write_or_delete(note, content, root=history.workspace_root(Path(manifest["note"]).parent))
    return {"run_id": run.run_id, "plan": [line], "files": [str(note)] if action != "none" else [], "action": action}


def _exact_undo(note: Path, manifest: dict) -> tuple[str, bytes | None, str]:
    """(action, the note's new bytes, plan line) putting back the note's bytes from before the run."""
    backup = manifest.get("backup")
    if backup is None:
        return "delete", None, f"delete {note}: the flush created it and it has not changed since"
    try:
        content = Path(backup).read_bytes()
    except FileNotFoundError as exc:
        raise RestoreRefused(f"cannot restore flush run: its backup {backup} is missing") from exc
    return "put_back", content, f"put back the previous content of {note} ({len(content)} bytes) from {backup}"


def _bullet_removal(note: Path, current: bytes, manifest: dict) -> tuple[str, bytes | None, str]:
    """(action, the note's new bytes, plan line) removing only the run's bullets from a note changed since."""
    try:
        parsed: DailyNote = decode_note(current, note.name)
    except NoteError as exc:
        raise RestoreRefused(f"cannot restore flush run: {note} changed since and {exc}") from exc
    removed = sum(len(remove_bullets(parsed, section, bullets))
                  for section, bullets in manifest["added_bullets"].items())
    drop_empty_sections(parsed, manifest.get("created_sections") or [])
    if not removed:
        return "none", None, f"{note} changed since and holds none of the run's bullets; nothing to undo"
    try:
        empty = manifest.get("backup") is None and parsed.render() == new_note(note_date(note.name)).render()
    except NoteError:
        empty = False
    if empty:
        return "delete", None, f"delete {note}: once the run's {removed} bullets are removed nothing is left"
    return ("remove_bullets", parsed.render().encode("utf-8"),
            f"remove the {removed} bullets this run added from {note} (it changed since the flush)")


def retry_delay(ws: WorkspaceSettings, failures: int) -> float:
    """Seconds before a flush that failed *failures* times this cycle is tried again: doubled each time."""
    return ws.consolidation.flush_retry_seconds * 2 ** max(0, failures - 1)


class Flush(Job):
    """params: session_key. An interrupted flush is only reported: it writes its note in one atomic replace, so
    the file is whole either way, and restore can undo it."""

    kind = FLUSH_KIND
    refresh_waits = False  # one note, written once at its end

    async def run(self, env: JobEnv, run_id: str, params: Mapping[str, Any]) -> dict:
        """Flush the session's unarchived messages still in its file, once per compaction cycle. A flush whose LLM
        call failed does not use the cycle's flush up: it may be tried again after a backoff (`retry_delay`)."""
        session_key = params["session_key"]
        messages = [message for _, message, present in env.tracker.pending(session_key) if present]
        manifest = await flush_session(env.settings, messages, session_key=session_key, llm=env.llm,
                                       store=env.store, run_id=run_id, now=env.now(),
                                       on_journalled=lambda: env.faults.reach("flush.journalled"))
        if manifest.get("llm_failed"):
            failures = env.tracker.sessions[session_key].flush_failures + 1
            env.tracker.flush_failed(session_key, env.clock() + retry_delay(env.settings, failures))
        else:
            env.tracker.set_cycle(session_key, flushed=True)
        return manifest

    async def restore(self, env: JobEnv, run: RunRecord, *, restore_run_id: str | None, force: bool,
                      dry_run: bool) -> dict:
        """The note's previous bytes when it is unchanged since, else only the bullets the flush added."""
        return restore_flush_run(run, dry_run=dry_run)

    def queue_policy(self, env: JobEnv, params: Mapping[str, Any]) -> QueuePolicy:
        key = params["session_key"]
        return QueuePolicy(target=f"session:{key}", session_key=key, uses_llm=True, manifest={"session": key})

    def changes(self, manifest: dict) -> dict:
        bullets = sum(len(items) for items in (manifest.get("added_bullets") or {}).values())
        note = str(manifest.get("note") or "")
        note = note[note.rfind("memory/"):] if "memory/" in note else note
        return {"bullets_added": bullets, "files": [note] if bullets else []}
