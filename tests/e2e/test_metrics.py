"""GET /metrics through a real daemon's socket, read by `nanobotctl metrics`, parsed as Prometheus text."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.support.workspace import conversation, make_workspace, write_session


def samples(text: str) -> dict[tuple, float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_nanobotctl_metrics_prints_the_daemons_figures_as_prometheus_text(tmp_path, daemon_process) -> None:
    workspace, sessions = make_workspace(tmp_path, layout="current")
    write_session(sessions, "cli:a", conversation(6))
    write_session(sessions, "cli:b", conversation(4))
    daemon = daemon_process(workspace)
    daemon.start()
    daemon.wait_for(lambda: daemon.session("cli:a") and daemon.session("cli:b"))
    run_id = daemon.ctl_json("consolidate", "cli:a")["run_id"]
    daemon.wait_for(lambda: daemon.ctl_json("run", run_id)["run"]["state"] == "finished", timeout=60)
    printed = daemon.ctl("metrics")
    assert printed.returncode == 0, printed.stderr
    figures = samples(printed.stdout)
    assert figures[("nanobotd_sessions_watched", (("workspace", "ws"),))] == 2
    outcomes = {labels: value for (name, labels), value in figures.items() if name == "nanobotd_job_outcomes_total"}
    assert sum(value for labels, value in outcomes.items() if ("kind", "consolidate") in labels) >= 1
    assert figures[("nanobotd_uptime_seconds", ())] > 0
    assert ("nanobotd_index_units", (("workspace", "ws"),)) in figures
