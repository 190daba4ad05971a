"""Session files changed by hand, not by the agent: every unarchived message still reaches history."""

from __future__ import annotations

import os

from tests.support.histories import archived_markers
from tests.support.workspace import conversation, make_workspace, write_session


def test_a_session_file_emptied_in_place_by_hand_loses_no_unarchived_message(tmp_path, daemon_process):
    workspace, sessions = make_workspace(tmp_path)
    daemon = daemon_process(workspace).start()
    daemon.wait_reconciled()
    messages = conversation(10, tag="a")
    path = write_session(sessions, "cli:a", messages[:6])
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 6)
    write_session(sessions, "cli:a", messages)  # saved by rename, as the agent saves
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("unarchived_messages") == 10)
    metadata = path.read_text().splitlines()[0]
    with open(path, "w") as handle:  # the user empties the conversation in place
        handle.write(metadata + "\n")
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("messages") == 0)
    consolidated = daemon.ctl("consolidate", "cli:a")
    assert consolidated.returncode == 0, consolidated.stderr
    assert sorted(set(archived_markers(workspace))) == sorted(f"A-{index} " for index in range(10))


def unarchived(daemon, key: str):
    return (daemon.session(key) or {}).get("unarchived_messages")


def test_a_session_file_rewritten_in_place_keeping_some_lines_loses_no_unarchived_message(tmp_path, daemon_process):
    """vim saves in place (same inode) a file with more than one link: the lines it keeps move, the ones the user
    deleted go. The messages the daemon held (in a copy it made of a long first version) and those it took in
    as text since are all archived."""
    workspace, sessions = make_workspace(tmp_path)
    daemon = daemon_process(workspace).start()
    daemon.wait_reconciled()
    messages = conversation(14, words=1000, tag="a")  # ~8 KB each: the first version is held in a copy
    path = write_session(sessions, "cli:a", messages[:10])
    daemon.wait_for(lambda: unarchived(daemon, "cli:a") == 10)
    write_session(sessions, "cli:a", messages)  # saved by rename, as the agent saves
    daemon.wait_for(lambda: unarchived(daemon, "cli:a") == 14)
    lines = path.read_text().splitlines()
    with open(path, "w") as handle:  # the user deletes three messages from the middle, in place
        handle.write("\n".join(lines[:3] + lines[6:12] + lines[13:]) + "\n")
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("messages") == 10)
    consolidated = daemon.ctl("consolidate", "cli:a")
    assert consolidated.returncode == 0, consolidated.stderr
    assert sorted(set(archived_markers(workspace))) == sorted(f"A-{index} " for index in range(14))
    assert "cannot be archived" not in daemon.log()


def test_the_daemon_never_gives_a_session_file_a_second_link(tmp_path, daemon_process):
    """A second link makes vim write the file in place, and whatever holds it sees every such write: the session
    files keep one link each through first scans, saves, an archive run and a restart."""
    workspace, sessions = make_workspace(tmp_path)
    daemon = daemon_process(workspace).start()
    daemon.wait_reconciled()
    messages = conversation(16, words=1000, tag="a")
    paths = [write_session(sessions, key, messages[:10]) for key in ("cli:a", "cli:b")]

    def links() -> list[int]:
        return [os.stat(path).st_nlink for path in paths]

    daemon.wait_for(lambda: unarchived(daemon, "cli:a") == unarchived(daemon, "cli:b") == 10)
    assert links() == [1, 1]
    for count in (12, 16):
        for key in ("cli:a", "cli:b"):
            write_session(sessions, key, messages[:count])
        daemon.wait_for(lambda count=count: unarchived(daemon, "cli:a") == unarchived(daemon, "cli:b") == count)
        assert links() == [1, 1]
    assert daemon.ctl("consolidate", "cli:a").returncode == 0
    assert links() == [1, 1]
    assert daemon.stop() == 0
    daemon.start()
    daemon.wait_reconciled()
    write_session(sessions, "cli:b", messages + conversation(2, tag="z"))
    daemon.wait_for(lambda: unarchived(daemon, "cli:b") == 18)
    assert links() == [1, 1]
    held = daemon.state_dir / "held"
    assert all(os.stat(entry).st_nlink == 1 for entry in held.iterdir())
