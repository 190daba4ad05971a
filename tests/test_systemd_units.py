"""The shipped systemd units: the settings the daemon relies on, and a clean `systemd-analyze verify`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT_DIR = Path(__file__).resolve().parents[1] / "systemd"
SYSTEM_UNIT = UNIT_DIR / "nanobotd.service"
USER_UNIT = UNIT_DIR / "nanobotd-user.service"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
STAND_IN_BINARY = shutil.which("true") or "/bin/true"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> every value (keys such as ReadWritePaths= may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def only(unit: dict, section: str, key: str) -> str:
    values = unit[section].get(key)
    assert values is not None, f"{key}= missing from [{section}]"
    assert len(values) == 1, f"{key}= set {len(values)} times"
    return values[0]


SHARED_SERVICE_SETTINGS = {
    "Type": "notify", "NotifyAccess": "main", "ExecReload": "/bin/kill -HUP $MAINPID", "WatchdogSec": "60",
    "TimeoutStopSec": "30", "Restart": "on-failure", "RestartSec": "5", "RuntimeDirectory": "nanobotd",
    "RuntimeDirectoryMode": "0700", "StateDirectory": "nanobotd", "StateDirectoryMode": "0700", "UMask": "0077",
    "NoNewPrivileges": "yes", "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6", "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
}
SYSTEM_HARDENING = {
    "User": "nanobotd", "Group": "nanobotd", "ProtectSystem": "strict", "ProtectHome": "read-only",
    "PrivateTmp": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes", "RestrictNamespaces": "yes", "CapabilityBoundingSet": "",
}


def test_the_system_unit_has_the_settings_the_daemon_relies_on() -> None:
    text = SYSTEM_UNIT.read_text()
    unit = parse_unit(text)
    for key, value in {**SHARED_SERVICE_SETTINGS, **SYSTEM_HARDENING}.items():
        assert only(unit, "Service", key) == value, key
    assert only(unit, "Service", "ExecStart") == "/usr/local/bin/nanobotd run --config /etc/nanobotd/config.toml"
    assert unit["Service"]["ReadWritePaths"], "the workspace needs to be writable under ProtectSystem=strict"
    assert "MemoryDenyWriteExecute" not in unit["Service"]
    assert "MemoryDenyWriteExecute" in text and "JIT" in text  # the reason it is off is written down
    assert "venv" in text  # how to point ExecStart at a virtualenv
    assert only(unit, "Install", "WantedBy") == "multi-user.target"


def test_the_user_unit_runs_as_the_calling_user_from_the_home_directory() -> None:
    unit = parse_unit(USER_UNIT.read_text())
    for key, value in SHARED_SERVICE_SETTINGS.items():
        assert only(unit, "Service", key) == value, key
    assert "User" not in unit["Service"] and "Group" not in unit["Service"]
    assert only(unit, "Service", "ExecStart").startswith("%h/")
    assert "%h/.config/nanobotd/config.toml" in only(unit, "Service", "ExecStart")
    assert only(unit, "Install", "WantedBy") == "default.target"


def verify(unit_path: Path, *, user: bool) -> tuple[int, list[str]]:
    """Run systemd-analyze verify on a copy whose ExecStart binary exists; return rc and its output lines."""
    with_binary = unit_path.read_text().replace("/usr/local/bin/nanobotd", STAND_IN_BINARY)
    with_binary = with_binary.replace("%h/.local/bin/nanobotd", STAND_IN_BINARY)
    copy = unit_path.parent / "work" / "nanobotd.service"
    copy.parent.mkdir(exist_ok=True)
    copy.write_text(with_binary)
    runtime_dir = unit_path.parent / "runtime"
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    environ = {**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir), "HOME": str(unit_path.parent),
               "SYSTEMD_LOG_COLOR": "0"}
    command = [SYSTEMD_ANALYZE, *(["--user"] if user else []), "verify", str(copy)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environ)
    output = (result.stdout + result.stderr).splitlines()
    if any("Failed to initialize manager" in line for line in output):
        pytest.skip(f"systemd-analyze cannot run here: {output}")
    return result.returncode, [line for line in output if "nanobotd" in line]


@pytest.fixture
def unit_copy(tmp_path: Path):
    def copy(source: Path) -> Path:
        target = tmp_path / source.name
        target.write_text(source.read_text())
        return target

    return copy


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("source, user", [(SYSTEM_UNIT, False), (USER_UNIT, True)], ids=["system", "user"])
def test_systemd_analyze_verify_finds_nothing_to_complain_about(unit_copy, source: Path, user: bool) -> None:
    returncode, complaints = verify(unit_copy(source), user=user)
    assert returncode == 0
    assert complaints == []


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_the_verify_check_notices_a_warning_about_the_unit(unit_copy) -> None:
    broken = unit_copy(SYSTEM_UNIT)
    broken.write_text(broken.read_text().replace("[Install]", "ProtectSystm=strict\n\n[Install]"))
    _, complaints = verify(broken, user=False)
    assert any("ProtectSystm" in line for line in complaints)
