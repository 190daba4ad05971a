"""A run's journal a step at a time: the records of a long run's steps are journalled one row each.

A consolidation journals before each chunk it archives. Were that journal the whole manifest, each chunk
would rewrite every earlier chunk's record with it: the bytes journalled would grow with the square of the
chunks. So each step's record is its own row of `run_steps` and the run's manifest holds only its head (the
manifest less the list of steps). Reading a run puts the steps back under their list's key, and finishing it folds them
into its manifest, so a finished run's manifest is what it always was.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable

STEPS_KEY = "chunks"  # the manifest's list of step records (a consolidation's chunks)


def write_steps(db: sqlite3.Connection, run_id: str, steps: Iterable[tuple[int, dict]], head: dict) -> None:
    """Journal the records of *steps* ((number, record), a record replacing the step's earlier one) and the
    run's *head*, inside a transaction the caller holds: each costs its own size, whatever came before."""
    db.executemany("INSERT OR REPLACE INTO run_steps (run_id, step, record) VALUES (?, ?, ?)",
                   [(run_id, number, json.dumps(record)) for number, record in steps])
    head = {key: value for key, value in head.items() if key != STEPS_KEY}  # the steps are journalled apart
    db.execute("UPDATE runs SET manifest=? WHERE run_id=?", (json.dumps(head), run_id))


def steps_of(db: sqlite3.Connection, run_ids: list[str],
             known: dict[str, dict[int, tuple[str, dict]]] | None = None) -> dict[str, list[dict]]:
    """The journalled step records of each of *run_ids* that has any, in step order. *known*: per run, each step's
    record text and what it decoded to, kept up to date here: a record read again as it was is not decoded again (a
    waiting nanobotctl asks for a long consolidation's manifest five times a second), and a copy of it is returned."""
    found: dict[str, list[dict]] = {}
    for start in range(0, len(run_ids), 500):
        part = run_ids[start:start + 500]
        rows = db.execute(f"SELECT run_id, step, record FROM run_steps WHERE run_id IN ({','.join('?' * len(part))})"
                          " ORDER BY run_id, step", part)
        for run_id, step, text in rows:
            if known is None:
                found.setdefault(run_id, []).append(read_manifest(text))
                continue
            decoded = known.setdefault(run_id, {}).get(step)
            if decoded is None or decoded[0] != text:
                decoded = known[run_id][step] = (text, read_manifest(text))
            found.setdefault(run_id, []).append(dict(decoded[1]))
    return found


def with_steps(manifest: dict, steps: list[dict] | None) -> dict:
    """*manifest* with its journalled *steps* under STEPS_KEY (as it is when they are none)."""
    return manifest if steps is None else {**manifest, STEPS_KEY: steps}


def fold_steps(db: sqlite3.Connection, run_id: str, manifest: dict | None) -> dict | None:
    """The manifest a finishing run keeps, and its step rows dropped (inside the caller's transaction).

    *manifest*: the whole manifest the run ends with (it holds every step), or None to keep the journalled
    one, its steps folded back in. None when there is nothing to change.
    """
    if manifest is not None:  # it holds every step already: its rows are only dropped, never read
        db.execute("DELETE FROM run_steps WHERE run_id=?", (run_id,))
        return manifest
    steps = steps_of(db, [run_id]).get(run_id)
    if steps is None:
        return None
    db.execute("DELETE FROM run_steps WHERE run_id=?", (run_id,))
    row = db.execute("SELECT manifest FROM runs WHERE run_id=?", (run_id,)).fetchone()
    return with_steps(read_manifest(row[0]) if row else {}, steps)


def read_manifest(text: str) -> dict:
    """A journalled manifest or step record; one that is not a JSON object is kept as its text."""
    try:
        record = json.loads(text)
    except ValueError:
        return {"unreadable_manifest": text}
    return record if isinstance(record, dict) else {"unreadable_manifest": text}
