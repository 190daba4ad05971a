"""nanobotd: a memory daemon for nanobot-style agent workspaces."""

__version__ = "0.1.0"
