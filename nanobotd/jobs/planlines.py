"""A lifecycle plan's steps as lines for people (the lifecycle dry run and the audit both show plans)."""

from __future__ import annotations


def describe_step(step: dict) -> str:
    """One lifecycle plan step as a line for people (the lifecycle dry run and the audit both show plans)."""
    action = step.get("action")
    if action == "move":
        return f"move {step['from']} -> {step['to']} ({step['bytes']} bytes, {step['age_days']} days old)"
    if action == "summarise":
        return f"summarise {len(step['notes'])} expired note(s) ({step['bytes']} bytes) into memory/history.jsonl"
    if action == "delete":
        return f"delete {step['path']} ({step['bytes']} bytes, {step['age_days']} days old; backup kept)"
    if action == "compact_history":
        return (f"compact memory/history.jsonl to {step['keep']} entries: remove {step['count']} dreamt entries"
                f" (cursors {step['first']}-{step['last']}; saved in the run's backups)")
    if action == "prune_backups":
        return f"prune backups of run {step['run_id']} ({step['bytes']} bytes, {step['age_days']} days old)"
    return str(step)
