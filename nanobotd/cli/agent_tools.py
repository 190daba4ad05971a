"""The memory tools an agent calls through `nanobotctl mcp` (standard library only; adapted by commands/mcp.py).
Answers stay under MAX_RESULT_CHARS (nanobot swaps a longer one for a file); tools never raise: errors are sentences."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any, NamedTuple

from nanobotd.cli.client import START_HINT, CannotConnect, Client, DaemonError
from nanobotd.cli.render import span

MAX_RESULT_CHARS = 15_000  # nanobot's maxToolResultChars is 16,000; leave room for its own framing
DEFAULT_SEARCH_LIMIT, MAX_SEARCH_LIMIT = 8, 20
HIT_CHARS = 1_500  # one hit's text: enough to quote, small enough for an agent with a short window
DEFAULT_CONTEXT_BUDGET, MAX_CONTEXT_BUDGET = 2000, 3500  # tokens; 3,500 tokens stay under 15,000 chars
MAX_RECALL_DAYS = 31  # the daemon's own limit, repeated so a bad range is explained before asking it
RECALL_CHARS = 12_000
# Longer text goes in no tool argument: queries are keywords, and the daemon reads at most 64 KiB of request
# head, which a 2,000-character query fills to a third even when every character is escaped as 4 UTF-8 bytes.
MAX_TEXT_CHARS = 2_000
RANGE = re.compile(r"(\d{4}-\d{2}-\d{2})(?:\s*\.\.\s*(\d{4}-\d{2}-\d{2}))?")
NOT_RUNNING = ("nanobotd, the memory daemon, is not running or cannot be reached ({reason}), so memory cannot "
               "be read right now. Start it with `nanobotd run --workspace DIR` (or `systemctl --user start "
               "nanobotd` when it is installed as a service) and try again.")


class ToolFailure(Exception):
    """A tool call that cannot be answered; the message is what the model reads (an isError result)."""


class ToolSpec(NamedTuple):
    """One MCP tool: name, what a model should know, JSON schema, what runs it (a NamedTuple: dataclasses import
    inspect, which would slow every nanobotctl command)."""

    name: str
    description: str
    input_schema: dict
    run: Callable[[Client, Mapping[str, Any]], str]


def call_tool(client: Client, name: str, arguments: Mapping[str, Any] | None) -> tuple[str, bool]:
    """(text, is_error) for one tool call; every failure becomes a sentence, never an exception."""
    spec = next((spec for spec in TOOLS if spec.name == name), None)
    if spec is None:
        return f"unknown tool {name!r}; the tools are {', '.join(spec.name for spec in TOOLS)}", True
    try:
        return cap_text(spec.run(bound_client(client, arguments or {}), arguments or {})), False
    except ToolFailure as exc:
        return str(exc), True
    except CannotConnect as exc:
        reason = str(exc) if exc.hint == START_HINT else f"{exc}; {exc.hint}"
        return NOT_RUNNING.format(reason=reason), True
    except DaemonError as exc:
        return f"nanobotd could not answer: {exc.message}", True


def bound_client(client: Client, arguments: Mapping[str, Any]) -> Client:
    """*client* bound to the one workspace it answers for (--workspace, else the daemon's only one: with several
    it cannot tell its agent's); ToolFailure for an argument naming another."""
    asked = text_argument(arguments, "workspace")
    name = client.workspace
    if not name:
        names = [str(workspace.get("name")) for workspace in client.get("/v1/status").get("workspaces") or []]
        if len(names) != 1:
            raise ToolFailure(f"nanobotd manages {len(names)} workspaces ({', '.join(names)}) and this memory "
                              "server is bound to none; run `nanobotctl setup nanobot --apply` (it adds --workspace "
                              "to the server's arguments) and restart nanobot")
        name = names[0]
    if asked and asked != name:
        raise ToolFailure(f"this memory server answers only for workspace {name!r}, not {asked!r}")
    return client if client.workspace else Client(client.socket_path, client.timeout, name)


def cap_text(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """*text* cut to *limit* characters with a note saying so, so nanobot never swaps it for a file."""
    if len(text) <= limit:
        return text
    note = f"\n… (cut at {limit} characters; ask for less to see the rest)"
    return text[:limit - len(note)].rstrip() + note


# -- memory_search -----------------------------------------------------------------------------------

def search(client: Client, arguments: Mapping[str, Any]) -> str:
    """GET /v1/search, the hits as labelled blocks, best first."""
    query = text_argument(arguments, "query", required=True)
    limit = int_argument(arguments, "limit", DEFAULT_SEARCH_LIMIT, 1, MAX_SEARCH_LIMIT)
    data = client.get("/v1/search", {"q": query, "limit": limit})
    hits = data.get("hits") or []
    if not hits:
        return f"No memory matches {query!r}. Try other words (names, places, distinctive terms)."
    header = f"{len(hits)} memory hit(s) for {query!r}, best first:"
    if data.get("degraded"):
        header += f"\n(search degraded: {data['degraded']})"
    per_hit = min(HIT_CHARS, max(600, MAX_RESULT_CHARS // len(hits)))
    blocks = [f"[{number}] {hit_label(hit)}\n{cap_text(hit_text(hit), per_hit)}" for number, hit in enumerate(hits, 1)]
    return join_blocks(header, blocks, "hit(s)", "use a smaller limit or more specific words")


def hit_label(hit: Mapping[str, Any]) -> str:
    """`history · memory/history.jsonl lines 7 (session cli:a) · 2026-11-20 10:15`: source, where, when (a session
    window by key and message range: its file name is base64 noise)."""
    key = hit.get("session_key")
    if key and hit.get("source") == "session":
        where = f"session {key}{span(' messages ', hit.get('message_start'), hit.get('message_end'))}"
    else:
        where = f"{hit.get('path') or '?'}{span(' lines ', hit.get('line_start'), hit.get('line_end'))}"
        where += f" (session {key})" if key else ""
    when = str(hit.get("when") or "").replace("T", " ")[:16]
    return " · ".join(part for part in (str(hit.get("source") or "memory"), where, when) if part)


def hit_text(hit: Mapping[str, Any]) -> str:
    """The hit's whole unit when the backend gave it, else its snippet; blank-line runs squeezed."""
    text = str(hit.get("text") or hit.get("snippet") or "").strip()
    return re.sub(r"\n{3,}", "\n\n", text)


# -- memory_context ----------------------------------------------------------------------------------

def context(client: Client, arguments: Mapping[str, Any]) -> str:
    """GET /v1/context: the budgeted memory context, as the daemon assembled it."""
    query = {"session": text_argument(arguments, "session_key"), "query": text_argument(arguments, "query"),
             "budget_tokens": int_argument(arguments, "budget_tokens", DEFAULT_CONTEXT_BUDGET, 200,
                                           MAX_CONTEXT_BUDGET)}
    try:
        data = client.get("/v1/context", query)
    except DaemonError as exc:
        if exc.code != "unknown_session":
            raise
        # A session nanobotd has not seen yet (just started): the context without skipping its turns.
        data = client.get("/v1/context", dict(query, session=""))
    text = str(data.get("text") or "").strip()
    if not text:
        return ("Memory is empty: nothing matches and no history is newer than the last dream "
                "(SOUL.md, USER.md and MEMORY.md are in your prompt already).")
    return f"{text}\n\n(memory context: {data.get('tokens', '?')} of {data.get('budget_tokens', '?')} tokens)"


# -- memory_recall -----------------------------------------------------------------------------------

def recall(client: Client, arguments: Mapping[str, Any]) -> str:
    """GET /v1/recall for one day or a range: each record under a label with its date and source."""
    first, last = parse_range(text_argument(arguments, "date", required=True))
    data = client.get("/v1/recall", {"from": first.isoformat(), "to": last.isoformat(), "max_chars": RECALL_CHARS})
    days = first.isoformat() if first == last else f"{first.isoformat()}..{last.isoformat()}"
    items = data.get("items") or []
    if not items:
        return (f"Nothing recorded for {days}: no daily note and no history entry on those days. "
                "Try memory_search with words from the topic.")
    blocks = [f"== {recall_label(item)} ==\n{str(item.get('text') or '').strip()}" for item in items]
    text = "\n\n".join([f"Memory recorded on {days} ({len(items)} item(s), oldest first):"] + blocks)
    return text + (f"\n\n({data['note']})" if data.get("note") else "")


def recall_label(item: Mapping[str, Any]) -> str:
    """`2026-11-20 10:15 · history #5 · session cli:a` or `2026-11-20 · daily note · memory/2026-11-20.md`."""
    if item.get("source") == "history":
        parts = [str(item.get("timestamp") or item.get("date")), f"history #{item.get('cursor')}"]
        if item.get("session_key"):
            parts.append(f"session {item['session_key']}")
        return " · ".join(parts)
    return " · ".join(str(item.get(key) or "?") for key in ("date", "source", "path"))


def parse_range(text: str) -> tuple[date, date]:
    """'2026-11-20' or '2026-11-18..2026-11-20' as (first, last); ToolFailure explains a bad one."""
    match = RANGE.fullmatch(text.strip())
    try:
        if match is None:
            raise ValueError(text)
        first = date.fromisoformat(match.group(1))
        last = date.fromisoformat(match.group(2) or match.group(1))
    except ValueError:
        raise ToolFailure(f"date must be one day as YYYY-MM-DD or a range as YYYY-MM-DD..YYYY-MM-DD, "
                          f"not {text!r}") from None
    if last < first:
        raise ToolFailure(f"the range {text!r} ends before it starts; put the earlier date first")
    if (last - first).days >= MAX_RECALL_DAYS:
        raise ToolFailure(f"ask for at most {MAX_RECALL_DAYS} days at a time, not {(last - first).days + 1}")
    return first, last


# -- arguments and answers ---------------------------------------------------------------------------

def text_argument(arguments: Mapping[str, Any], name: str, *, required: bool = False) -> str:
    """A string argument (blank counts as absent); ToolFailure when a required one is missing or too long."""
    value = arguments.get(name)
    text = "" if value is None else str(value).strip()
    if required and not text:
        raise ToolFailure(f"the {name!r} argument is required")
    if len(text) > MAX_TEXT_CHARS:
        raise ToolFailure(f"the {name!r} argument is too long ({len(text):,} characters); pass at most "
                          f"{MAX_TEXT_CHARS:,}: the distinctive words, not a whole text")
    return text


def int_argument(arguments: Mapping[str, Any], name: str, default: int, minimum: int, maximum: int) -> int:
    """An integer argument clamped to [minimum, maximum]; models send "8" as often as 8."""
    value = arguments.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's 1e400 is float("inf")
        raise ToolFailure(f"the {name!r} argument must be a whole number, not {value!r}") from None
    return min(max(number, minimum), maximum)


def join_blocks(header: str, blocks: list[str], what: str, advice: str) -> str:
    """Header and blocks separated by blank lines, stopping before MAX_RESULT_CHARS with a count of the rest."""
    parts, size = [header], len(header)
    for index, block in enumerate(blocks):
        if size + len(block) + 2 > MAX_RESULT_CHARS - 200:
            parts.append(f"({len(blocks) - index} more {what} left out to stay under {MAX_RESULT_CHARS} "
                         f"characters; {advice})")
            break
        parts.append(block)
        size += len(block) + 2
    return "\n\n".join(parts)


TOOLS = (
    ToolSpec(
        name="memory_search",
        description=(
            "Search your long-term memory kept by nanobotd: past conversations (also those already compacted "
            "out of your context), archived history, daily notes, and the sections of MEMORY.md, USER.md and "
            "SOUL.md. Use it whenever the user refers to something you do not see in your context (an earlier "
            "decision, a name, a preference, 'what did we say about X') before answering from guesswork. It "
            "searches by keywords: pass the distinctive words (names, places, terms), not a whole sentence. "
            "Returns up to `limit` hits, best first, each labelled with its source (memory, note, history or "
            "session), where it lives (file and lines, or session and messages) and when; the answer stays "
            f"under {MAX_RESULT_CHARS:,} characters, and says so when nothing matches."),
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "the words to look for, e.g. 'kestrel launch venue'"},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_LIMIT,
                          "default": DEFAULT_SEARCH_LIMIT,
                          "description": f"how many hits at most (default {DEFAULT_SEARCH_LIMIT})"},
            },
            "required": ["query"],
        },
        run=search,
    ),
    ToolSpec(
        name="memory_context",
        description=(
            "Assemble the memory context nanobotd would give you for a turn, within a token budget: the "
            "memory most relevant to `query` (past conversations, history, daily notes), then the recent "
            "history entries not yet folded into MEMORY.md; SOUL.md, USER.md and MEMORY.md are left out, as "
            "they are in your prompt already. Use it when you start a task that depends on earlier work, or "
            "after your conversation was compacted and you need to re-ground yourself; for one specific fact "
            "memory_search is cheaper. Pass your session key (such as 'telegram:12345') when you know it, so "
            "messages already in your prompt are not repeated. Returns plain text with a line saying how many "
            f"tokens it used; budget_tokens is capped at {MAX_CONTEXT_BUDGET:,}."),
        input_schema={
            "type": "object",
            "properties": {
                "session_key": {"type": "string", "description": "your session key, if known (channel:chat id)"},
                "budget_tokens": {"type": "integer", "minimum": 200, "maximum": MAX_CONTEXT_BUDGET,
                                  "default": DEFAULT_CONTEXT_BUDGET,
                                  "description": f"token budget (default {DEFAULT_CONTEXT_BUDGET})"},
                "query": {"type": "string", "description": "what you are about to work on, to pick relevant memory"},
            },
        },
        run=context,
    ),
    ToolSpec(
        name="memory_recall",
        description=(
            "Read what was recorded on a day or a range of days: the daily notes (memory/YYYY-MM-DD.md, also "
            "archived ones) and the history entries (summaries of conversations) written on those days. Use it "
            "for questions about time, such as 'what did we do yesterday', 'what happened last week' or 'what "
            "did we decide on the 20th'; work the dates out from today's date first. Items come oldest first, "
            "each labelled with its date and source; the answer is cut at about "
            f"{RECALL_CHARS:,} characters with a note naming what was left out (ask for fewer days to see it). "
            f"At most {MAX_RECALL_DAYS} days per call."),
        input_schema={
            "type": "object",
            "properties": {
                "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}(\.\.\d{4}-\d{2}-\d{2})?$",
                         "description": "one day '2026-11-20', or an inclusive range '2026-11-18..2026-11-20'"},
            },
            "required": ["date"],
        },
        run=recall,
    ),
)
