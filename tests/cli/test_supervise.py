"""The embedded stack's supervisor (cdclake.dev.supervise) on real child processes: a component
killed is started again after its backoff, with the cause said and logged; the others are left
alone; ``cdclake status`` shows what the supervisor wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cdclake.cli.main import main
from cdclake.dev import supervise
from tests.support import make_settings


class Stack:
    """LocalStack's part the supervisor uses, over ``sleep`` processes in sessions of their own."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.said: list[str] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for name in ("receiver", "spark-connect"):
            self.respawn(name)

    def respawn(self, name: str) -> None:
        cmd = [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"]
        self.procs[name] = subprocess.Popen(cmd, start_new_session=True)

    def say(self, msg: str) -> None:
        self.said.append(msg)

    def stop(self) -> None:
        for p in self.procs.values():
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def until(cond: Callable[[], bool], timeout: float = 10.0, sup: supervise.Supervisor | None = None) -> None:
    """Until ``cond()``, letting ``sup`` look at the components in between."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        if sup is not None:
            sup.check()
        time.sleep(0.05)


@pytest.mark.server
def test_a_killed_component_is_started_again_with_its_cause_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(supervise, "BACKOFF_S", (0.2, 0.4))
    stack = Stack(tmp_path)
    try:
        sup = supervise.Supervisor(stack)
        receiver, first = stack.procs["receiver"].pid, stack.procs["spark-connect"].pid
        os.kill(first, signal.SIGKILL)
        until(lambda: stack.procs["spark-connect"].poll() is not None)
        sup.check()
        assert stack.said == ["spark-connect killed by SIGKILL; starting it again in 0.2s (restart 1)"]
        assert json.loads((tmp_path / "stack.json").read_text())["components"]["spark-connect"]["state"] == "restarting"
        until(lambda: stack.procs["spark-connect"].pid != first, sup=sup)
        second = stack.procs["spark-connect"].pid
        assert stack.procs["spark-connect"].poll() is None and stack.procs["receiver"].pid == receiver
        assert "killed by SIGKILL" in (tmp_path / "supervisor.log").read_text()
        # Its orphan (the `sleep` it started) went with it: nothing of the dead one is left.
        assert subprocess.run(["pgrep", "-g", str(first)], capture_output=True).stdout == b""

        os.kill(second, signal.SIGTERM)  # a second exit in a row waits the next backoff step
        until(lambda: stack.procs["spark-connect"].poll() is not None)
        sup.check()
        assert stack.said[-1] == "spark-connect killed by SIGTERM; starting it again in 0.4s (restart 2)"
        until(lambda: stack.procs["spark-connect"].pid != second, sup=sup)

        sup.write_status()
        settings = make_settings(tmp_path.parent / "home")
        (settings.home / "logs").mkdir(parents=True)
        (settings.home / "logs" / "stack.json").write_text((tmp_path / "stack.json").read_text())
        capsys.readouterr()
        assert main(["status", "--format", "json"], settings=settings) == 0
        rows = {r["component"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
        assert (rows["spark-connect"]["state"], rows["spark-connect"]["restarts"]) == ("running", 2)
        assert rows["spark-connect"]["last_exit"] == "killed by SIGTERM" and rows["receiver"]["restarts"] == 0
        sup.close()
        assert main(["status"], settings=make_settings(tmp_path / "none")) == 1
    finally:
        stack.stop()
