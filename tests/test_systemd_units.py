"""The shipped systemd units: the settings the daemon relies on, a clean `systemd-analyze verify`, and an
exposure score of at most 2.0 from `systemd-analyze security --offline=true`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT_DIR = Path(__file__).resolve().parents[1] / "systemd"
SYSTEM_UNIT = UNIT_DIR / "nanobotd.service"
USER_UNIT = UNIT_DIR / "nanobotd-user.service"
QMD_DROP_IN = UNIT_DIR / "nanobotd-qmd.conf"
MAX_EXPOSURE = 2.0
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
    "SystemCallArchitectures": "native", "SystemCallErrorNumber": "EPERM", "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
}
SYSTEM_HARDENING = {
    "User": "nanobotd", "Group": "nanobotd", "ProtectSystem": "strict", "ProtectHome": "read-only",
    "PrivateTmp": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes", "RestrictNamespaces": "yes", "CapabilityBoundingSet": "",
    "ProtectProc": "invisible", "ProcSubset": "pid", "RemoveIPC": "yes", "ProtectHostname": "yes",
    "ProtectClock": "yes", "MemoryDenyWriteExecute": "yes",
}
SYSCALL_FILTERS = ["@system-service", "~@privileged @resources"]


def test_the_system_unit_has_the_settings_the_daemon_relies_on() -> None:
    text = SYSTEM_UNIT.read_text()
    unit = parse_unit(text)
    for key, value in {**SHARED_SERVICE_SETTINGS, **SYSTEM_HARDENING}.items():
        assert only(unit, "Service", key) == value, key
    assert only(unit, "Service", "ExecStart") == "/usr/local/bin/nanobotd run --config /etc/nanobotd/config.toml"
    assert unit["Service"]["ReadWritePaths"], "the workspace needs to be writable under ProtectSystem=strict"
    assert not [path for path in unit["Service"]["ReadWritePaths"] if path.startswith("-")], \
        "a '-' lets an unedited unit start with the workspace read-only"
    documents = " ".join(unit["Unit"]["Documentation"]).split()
    assert documents and all(uri.startswith("file:///usr/share/doc/nanobotd/") for uri in documents)
    assert "file:///usr/share/doc/nanobotd/nanobot-compat.md" in documents  # docs/*.md, installed as it says
    assert (UNIT_DIR.parent / "docs" / "nanobot-compat.md").is_file() and "docs/*.md" in text
    assert unit["Service"]["SystemCallFilter"] == SYSCALL_FILTERS
    assert "IPAddressDeny" not in unit["Service"] and "PrivateNetwork" not in unit["Service"]
    assert "nanobotd-qmd.conf" in text and "JIT" in text  # how QMD gets its writable+executable memory back
    assert "venv" in text  # how to point ExecStart at a virtualenv
    assert only(unit, "Install", "WantedBy") == "multi-user.target"


def test_the_user_unit_runs_as_the_calling_user_from_the_home_directory() -> None:
    unit = parse_unit(USER_UNIT.read_text())
    for key, value in SHARED_SERVICE_SETTINGS.items():
        assert only(unit, "Service", key) == value, key
    assert "User" not in unit["Service"] and "Group" not in unit["Service"]
    assert only(unit, "Service", "ExecStart").startswith("%h/")
    assert only(unit, "Service", "ExecStart") == "%h/.local/bin/nanobotd run"  # no config file needed (the
    # default one when there is one, else nanobot's own workspace): `--config F` exits 2 when F is missing
    assert only(unit, "Install", "WantedBy") == "default.target"
    assert unit["Service"]["SystemCallFilter"] == SYSCALL_FILTERS
    text = USER_UNIT.read_text()
    assert "cannot sandbox" in text and "ProtectSystem=" in text and "system unit" in text


def test_the_qmd_drop_in_lifts_only_memory_deny_write_execute() -> None:
    unit = parse_unit(QMD_DROP_IN.read_text())
    assert unit == {"Service": {"MemoryDenyWriteExecute": ["no"]}}
    assert "Node" in QMD_DROP_IN.read_text() and "nanobotd.service.d" in QMD_DROP_IN.read_text()


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


def exposure(unit_path: Path) -> float:
    """The overall exposure level `systemd-analyze security --offline=true` gives the unit file."""
    result = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=true", "--no-pager", str(unit_path)],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "SYSTEMD_LOG_COLOR": "0"})
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout + result.stderr)
    if match is None:
        pytest.skip(f"systemd-analyze security --offline is not supported here: {result.stderr.strip()[:200]}")
    return float(match.group(1))


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_the_system_unit_scores_at_most_two_in_systemd_analyze_security(unit_copy) -> None:
    assert exposure(unit_copy(SYSTEM_UNIT)) <= MAX_EXPOSURE


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_the_system_unit_with_the_qmd_drop_in_verifies_and_still_scores_at_most_two(tmp_path) -> None:
    unit = tmp_path / "nanobotd.service"
    unit.write_text(SYSTEM_UNIT.read_text().replace("/usr/local/bin/nanobotd", STAND_IN_BINARY))
    merged = tmp_path / "merged" / "nanobotd.service"
    merged.parent.mkdir()
    merged.write_text(unit.read_text().replace("MemoryDenyWriteExecute=yes", QMD_DROP_IN.read_text()
                                               .split("[Service]", 1)[1].strip()))
    assert "MemoryDenyWriteExecute=no" in merged.read_text()
    assert exposure(merged) <= MAX_EXPOSURE
    returncode, complaints = verify(merged, user=False)
    assert returncode == 0 and complaints == []
