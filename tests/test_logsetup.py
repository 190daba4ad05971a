"""Log formats for terminal and journald, stdlib interception, and secret masking everywhere."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest
from loguru import logger

from nanobotd.logsetup import NOISY_LOGGERS, capture_library_loggers, configure_logging, syslog_priority

SECRET = "sk-test-5f1e2d3c4b5a69788796a5b4"


@pytest.fixture(autouse=True)
def restore_logging():
    root_handlers, root_level = list(logging.root.handlers), logging.root.level
    levels = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    yield
    logger.remove()
    logger.add(sys.stderr)
    logging.root.handlers[:] = root_handlers
    logging.root.setLevel(root_level)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def configured(level: str = "DEBUG", *, under_systemd: bool = False, secrets: list[str] | None = None) -> io.StringIO:
    stream = io.StringIO()
    configure_logging(level, under_systemd=under_systemd, secrets=[SECRET] if secrets is None else secrets,
                      stream=stream)
    return stream


def raise_with_secret() -> None:
    raise ValueError(f"upstream rejected key {SECRET}")


def test_terminal_lines_are_timestamped(capsys: pytest.CaptureFixture) -> None:
    configure_logging("INFO", under_systemd=False, secrets=[])
    logger.info("hello {}", "world")
    logger.debug("not shown at INFO")
    err = capsys.readouterr().err
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} INFO     tests\.test_logsetup: hello world\n", err)


def test_journal_lines_carry_syslog_priorities_and_no_timestamp() -> None:
    stream = configured(under_systemd=True)
    logger.debug("d")
    logger.info("i")
    logger.success("s")
    logger.warning("w")
    logger.error("e")
    logger.critical("c")
    assert stream.getvalue().splitlines() == [
        "<7>tests.test_logsetup: d", "<6>tests.test_logsetup: i", "<5>tests.test_logsetup: s",
        "<4>tests.test_logsetup: w", "<3>tests.test_logsetup: e", "<2>tests.test_logsetup: c"]


def test_every_traceback_line_keeps_the_journal_priority() -> None:
    stream = configured(under_systemd=True)
    try:
        raise_with_secret()
    except ValueError:
        logger.exception("job failed")
    lines = stream.getvalue().splitlines()
    assert len(lines) > 3
    assert all(line.startswith("<3>") for line in lines)
    assert "Traceback" in stream.getvalue()


def test_stdlib_logging_is_routed_into_loguru_with_its_level() -> None:
    stream = configured(under_systemd=True)
    logging.getLogger("nanobotd.somewhere").warning("careful %s", "now")
    assert stream.getvalue() == "<4>tests.test_logsetup: careful now\n"


def test_noisy_libraries_are_quieted_to_warning() -> None:
    stream = configured()
    logging.getLogger("apscheduler.scheduler").info("Added job")
    logging.getLogger("httpx").info("HTTP Request: POST ...")
    logging.getLogger("watchdog.observers").warning("inotify overflow")
    output = stream.getvalue()
    assert "Added job" not in output and "HTTP Request" not in output
    assert "inotify overflow" in output


def test_a_secret_never_appears_in_the_output() -> None:
    stream = configured()
    logger.info("calling with api_key={}", SECRET)
    logging.getLogger("LiteLLM").warning("litellm saw %s", SECRET)
    try:
        raise_with_secret()
    except ValueError:
        logger.exception("consolidation failed")
        logging.getLogger("nanobotd.jobs").exception("stdlib view of the failure")
    output = stream.getvalue()
    assert SECRET not in output
    assert output.count("***") == 4  # direct, stdlib, and the exception text of both tracebacks
    assert "api_key=***" in output and "upstream rejected key ***" in output


def test_secrets_are_masked_in_journal_output_too() -> None:
    stream = configured(under_systemd=True)
    logger.error("bad key {}", SECRET)
    assert stream.getvalue() == "<3>tests.test_logsetup: bad key ***\n"


def test_short_secrets_are_not_masked() -> None:
    stream = configured(secrets=["abc", "", SECRET])
    logger.info("abc and {}", SECRET)
    assert "abc and ***" in stream.getvalue()


def test_handlers_a_library_attached_itself_are_dropped() -> None:
    stream = configured()
    private = io.StringIO()
    logging.getLogger("LiteLLM").addHandler(logging.StreamHandler(private))  # as litellm does on import
    capture_library_loggers()
    logging.getLogger("LiteLLM").warning("key %s", SECRET)
    assert private.getvalue() == ""
    assert "key ***" in stream.getvalue()


def test_syslog_priority_boundaries() -> None:
    assert [syslog_priority(number) for number in (5, 10, 20, 25, 30, 40, 50)] == [7, 7, 6, 5, 4, 3, 2]
