"""`nanobotd`: argv -> config -> Daemon. Exit 2 on a bad config, naming the key; warnings for a config that
loads but cannot work as meant (a model without its API key)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

from nanobotd import __version__
from nanobotd.config.load import ConfigError, load_config

EXIT_CONFIG = 2
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
RUN_HELP = "run the daemon (the default)"
CHECK_HELP = "validate the config and print the effective settings"


def build_parser() -> argparse.ArgumentParser:
    """The daemon's command line; without a command it runs, as a service unit expects."""
    parser = argparse.ArgumentParser(prog="nanobotd", description="Memory daemon for nanobot workspaces.")
    parser.add_argument("--version", action="version", version=f"nanobotd {__version__}")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="config file (default: $XDG_CONFIG_HOME/nanobotd/config.toml, else "
                             "/etc/nanobotd/config.toml; with none, nanobot's workspace from ~/.nanobot/config.json)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help="what to do (default: run)")
    # `nanobotd --config F` has none of the sub-command's options: give them run's defaults.
    parser.set_defaults(command="run", sub_config=None, workspace=[], polling=False)
    run = sub.add_parser("run", help=RUN_HELP, description=RUN_HELP)
    check = sub.add_parser("check-config", help=CHECK_HELP, description=CHECK_HELP)
    for command in (run, check):
        command.add_argument("--config", type=Path, dest="sub_config", metavar="FILE",
                             help="config file (overrides a --config given before the command)")
        command.add_argument("--workspace", action="append", default=[], metavar="DIR",
                             help="manage this workspace instead of the config file's (repeatable; the rest of the "
                                  "file still applies, and a workspace it configures keeps its settings)")
    run.add_argument("--polling", action="store_true", help="use the polling observer instead of inotify")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `nanobotd`: load the config (exit 2 naming a bad key), then check it or run."""
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.sub_config or args.config, workspace_args=args.workspace or None)
    except ConfigError as exc:
        print(f"nanobotd: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "check-config":
        for warning in config_warnings(config):
            print(f"nanobotd: warning: {warning}", file=sys.stderr)
        print(json.dumps(config.to_json(), indent=2))
        return 0
    exit_now(run_daemon(config, polling=args.polling))


def config_warnings(config) -> list[str]:
    """What a valid config still gets wrong: a workspace folder that does not exist, an LLM configured whose
    API key variable is not set (a server on this machine, as llm.api_base, usually needs none)."""
    warnings = []
    if config.daemon.parse_processes:
        warnings.append("daemon.parse_processes is deprecated and ignored: a scan no longer counts tokens, so no"
                        " parse processes start; remove the key")
    for workspace in config.workspaces:
        if not workspace.path.is_dir():
            warnings.append(f"workspace {workspace.name}: folder {workspace.path} does not exist: nothing there is "
                            f"managed until it is created (a typo in its path?)")
        llm = workspace.llm
        host = urlsplit(llm.api_base).hostname if llm.api_base else None
        if llm.model.lower() == "none" or workspace.api_key or host in LOCAL_HOSTS:
            continue
        warnings.append(f"workspace {workspace.name}: llm.model is {llm.model!r} but ${llm.api_key_env} "
                        f"(named by llm.api_key_env) is not set: LLM calls will fail and consolidation "
                        f"falls back to raw archives")
    return warnings


def run_daemon(config, *, polling: bool = False) -> int:
    """Configure logging and notification, then run the daemon until it is told to stop."""
    from loguru import logger

    from nanobotd.logsetup import configure_logging

    secrets = [workspace.api_key for workspace in config.workspaces if workspace.api_key]
    configure_logging(config.daemon.log_level, under_systemd=config.under_systemd, secrets=secrets)

    from nanobotd.api.server import ControlSocketError
    from nanobotd.daemon.daemon import Daemon
    from nanobotd.daemon.lock import AlreadyRunning
    from nanobotd.notify import Notifier

    logger.info("{}", config.origin)
    for warning in config_warnings(config):
        logger.warning("{}", warning)
    daemon = Daemon(config, notifier=Notifier(dict(os.environ)), polling=polling)
    try:
        return run_loop(daemon.run())
    except (ControlSocketError, AlreadyRunning) as exc:
        print(f"nanobotd: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - the message is the point
        logger.opt(exception=exc).critical("nanobotd stopped: {}", exc)
        return 1


def run_loop(main_task) -> int:
    """asyncio.run, except that threads libraries left behind (litellm's import, say) are not waited for:
    the daemon has stopped and closed what is its own, so they hold nothing that must be kept."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main_task)
    finally:
        leftovers = asyncio.all_tasks(loop)
        for task in leftovers:
            task.cancel()
        if leftovers:
            loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()  # shuts the default executor down without waiting for its threads


def exit_now(code: int) -> NoReturn:
    """Leave once stopped: state is closed and logs flushed, and tearing down litellm's module graph and
    joining library threads at interpreter exit would keep a stopped daemon alive for seconds."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
