"""scripts/demo.sh's first install says what it is doing (it printed nothing for ~90 s), and a failed pip
install stops the demo naming the log. pip is played by a stand-in `.venv/bin/python` that prints what pip
prints; the script itself runs for real."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PIP_OUTPUT = """Obtaining file:///demo
Collecting litellm>=1.40
  Downloading litellm-1.50.0-py3-none-any.whl (6.2 MB)
Collecting apscheduler<4
Installing collected packages: apscheduler, litellm, nanobotd
Successfully installed apscheduler-3.10.4 litellm-1.50.0 nanobotd-0.1.0
"""


def demo_checkout(tmp_path: Path, pip_status: int) -> Path:
    """A checkout holding demo.sh and pyproject.toml, whose .venv python plays pip and then fails the demo."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "demo.sh", checkout / "scripts" / "demo.sh")
    shutil.copy(REPO / "pyproject.toml", checkout / "pyproject.toml")
    python = checkout / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    (checkout / "pip-output.txt").write_text(PIP_OUTPUT)
    python.write_text(f"""#!/bin/sh
if [ "$2" = pip ]; then cat "{checkout}/pip-output.txt"; exit {pip_status}; fi
echo "stand-in python: nothing more to do" >&2; exit 3
""")
    python.chmod(0o755)
    return checkout


def run_demo(checkout: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("NANOBOTD_DEMO")}
    env["NANOBOTD_DEMO_DIR"] = str(checkout / "demo")
    return subprocess.run(["bash", str(checkout / "scripts" / "demo.sh")], capture_output=True, text=True,
                          env=env, timeout=60)


def test_the_first_install_shows_its_progress(tmp_path):
    checkout = demo_checkout(tmp_path, pip_status=0)
    proc = run_demo(checkout)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("installing nanobotd and its dependencies into .venv (first run: a minute or two")
    assert lines[1:5] == ["  Collecting litellm>=1.40", "  Collecting apscheduler<4",
                          "  Installing collected packages: apscheduler, litellm, nanobotd",
                          "  Successfully installed apscheduler-3.10.4 litellm-1.50.0 nanobotd-0.1.0"]
    assert (checkout / ".venv" / "install.log").read_text() == PIP_OUTPUT
    assert (checkout / ".venv" / ".demo-installed").exists()


def test_a_failed_install_stops_the_demo_naming_the_log(tmp_path):
    checkout = demo_checkout(tmp_path, pip_status=1)
    proc = run_demo(checkout)
    assert proc.returncode == 1
    assert "pip install failed: see .venv/install.log" in proc.stderr
    assert not (checkout / ".venv" / ".demo-installed").exists()
