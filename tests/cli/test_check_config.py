"""Bad configs: `nanobotd check-config` exits 2 naming the key, for a dozen mistakes."""

from __future__ import annotations

import subprocess
import sys

import pytest

BAD_CONFIGS = [
    ("[daemon]\nlog_levle = 'INFO'\n", "daemon.log_levle"),
    ("[llm]\ntimeout_seconds = 'sixty'\n", "llm.timeout_seconds"),
    ("[consolidation]\nratio = 1.5\n", "consolidation.ratio"),
    ("[dream]\nschedule = '15 4 * * 0'\n", "dream.schedule"),
    ("[lifecycle]\nschedule = 'every night'\n", "lifecycle.schedule"),
    ("[search]\nbackend = 'elastic'\n", "search.backend"),
    ("[daemon]\ntimezone = 'Mars/Olympus'\n", "daemon.timezone"),
    ("[bogus]\nx = 1\n", "bogus"),
    ("[lifecycle]\nactive_days = 2.5\n", "lifecycle.active_days"),
    ("[dream]\nenabled = 'yes'\n", "dream.enabled"),
    ("[[workspaces]]\nsessions_dir = '/tmp'\n", "workspaces[0].path"),
    ("[[workspaces]]\npath = '/tmp/x'\n[workspaces.llm]\nmodle = 'x'\n", "workspaces[0].llm.modle"),
    ("[llm]\ncontext_window = 1000\nmax_tokens = 8192\n", "llm.context_window"),
    ("daemon = 3\n", "daemon"),
    ("[daemon\n", "not valid TOML"),
    ("", "workspaces"),
]


@pytest.mark.parametrize("text,key", BAD_CONFIGS, ids=[key for _, key in BAD_CONFIGS])
def test_bad_config_exits_2_naming_the_key(tmp_path, text, key):
    path = tmp_path / "bad.toml"
    if "workspaces" not in text and key != "workspaces":
        text += f"\n[[workspaces]]\npath = '{tmp_path}'\n"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "nanobotd.cli.nanobotd", "check-config", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert key in proc.stderr
