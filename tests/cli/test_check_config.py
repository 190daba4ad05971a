"""Bad configs: `nanobotd check-config` exits 2 naming the key, for a dozen mistakes."""

from __future__ import annotations

import json
import os
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


def test_an_api_key_in_the_config_points_at_api_key_env(tmp_path):
    path = tmp_path / "key.toml"
    path.write_text(f"[llm]\napi_key = 'sk-123'\n\n[[workspaces]]\npath = '{tmp_path}'\n")
    proc = subprocess.run([sys.executable, "-m", "nanobotd.cli.nanobotd", "check-config", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "llm.api_key: unknown key (the key itself never goes in the config" in proc.stderr
    assert "llm.api_key_env" in proc.stderr


def test_check_config_warns_when_a_model_has_no_api_key_to_use(tmp_path):
    path = tmp_path / "model.toml"
    path.write_text(f"[llm]\nmodel = 'openai/gpt-4o-mini'\napi_key_env = 'NANOBOTD_TEST_KEY'\n\n"
                    f"[[workspaces]]\npath = '{tmp_path}'\nname = 'ws'\n")
    command = [sys.executable, "-m", "nanobotd.cli.nanobotd", "check-config", "--config", str(path)]
    environ = {name: value for name, value in os.environ.items() if name != "NANOBOTD_TEST_KEY"}
    unset = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environ)
    assert unset.returncode == 0
    assert ("nanobotd: warning: workspace ws: llm.model is 'openai/gpt-4o-mini' but $NANOBOTD_TEST_KEY "
            "(named by llm.api_key_env) is not set") in unset.stderr
    assert json.loads(unset.stdout)
    given = subprocess.run(command, capture_output=True, text=True, timeout=60,
                           env=dict(environ, NANOBOTD_TEST_KEY="sk-abcdef"))
    assert given.returncode == 0 and given.stderr == ""
