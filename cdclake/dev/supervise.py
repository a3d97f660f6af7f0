"""Keeps the embedded stack's components running (:class:`cdclake.dev.stack.LocalStack`).

A component that exits (Spark Connect, the Airflow api-server, scheduler or dag-processor, the
REST catalog, a receiver) is started again with the same command and environment, after a
backoff that doubles per restart in a row (1 s up to 60 s) and starts over once it has stayed up
for :data:`HEALTHY_S`; what it left running (its process group) is killed when its exit is seen.
Each exit and restart is said on the stack's output and in ``$CDCLAKE_HOME/logs/supervisor.log``
with its cause (exit code or signal). The others go on: the receiver keeps acknowledging batches
durably while Spark Connect or Airflow is down, and what landed meanwhile is applied by the next
``cdc_apply`` run.

``$CDCLAKE_HOME/logs/stack.json`` holds each component's state for ``cdclake status``; it is
written on every change and removed when the stack stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 60.0)
HEALTHY_S = 60.0
"""Up this long after a restart: the next exit starts the backoff from its first step again."""
POLL_S = 0.5


class Supervised(Protocol):
    """What the supervisor needs of the stack."""

    logs: Path

    @property
    def procs(self) -> dict[str, Any]: ...

    def respawn(self, name: str) -> None: ...

    def say(self, msg: str) -> None: ...


@dataclass
class State:
    restarts: int = 0
    step: int = 0  # the backoff step the next restart waits
    since: float = 0.0  # wall time it last started
    last_exit: str | None = None
    restart_at: float | None = None  # monotonic time a dead component is started again


def cause(returncode: int) -> str:
    """``exited with 1``, ``killed by SIGKILL``."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exited with {returncode}"


class Supervisor:
    def __init__(self, stack: Supervised) -> None:
        self.stack = stack
        self.states = {name: State(since=time.time()) for name in stack.procs}
        self.status_file = stack.logs / "stack.json"
        self._log = stack.logs / "supervisor.log"
        self.write_status()

    def check(self) -> None:
        """One look at every component: a dead one is scheduled for a restart, or restarted."""
        now = time.monotonic()
        changed = False
        for name, p in list(self.stack.procs.items()):
            st = self.states.setdefault(name, State(since=time.time()))
            code = p.poll()
            if code is None:
                if st.step and time.time() - st.since > HEALTHY_S:
                    st.step = 0
                continue
            if st.restart_at is None:
                # Its own session (LocalStack starts each in one): what it left running goes now,
                # while the group id cannot have been reused (a member still holds it).
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)
                delay = BACKOFF_S[min(st.step, len(BACKOFF_S) - 1)]
                st.last_exit, st.restart_at = cause(code), now + delay
                self._say(f"{name} {st.last_exit}; starting it again in {delay:g}s (restart {st.restarts + 1})")
                changed = True
            elif now >= st.restart_at:
                self.stack.respawn(name)
                st.restarts, st.step, st.since, st.restart_at = st.restarts + 1, st.step + 1, time.time(), None
                self._say(f"{name} started again (pid {self.stack.procs[name].pid}); log: {self.stack.logs / name}.log")
                changed = True
        if changed:
            self.write_status()

    def run(self, stop: threading.Event | None = None) -> None:
        """:meth:`check` every :data:`POLL_S` until ``stop`` is set (forever without one)."""
        stop = stop or threading.Event()
        while not stop.wait(POLL_S):
            self.check()

    def _say(self, msg: str) -> None:
        self.stack.say(msg)
        with open(self._log, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {msg}\n")

    def write_status(self) -> None:
        components = {}
        for name, p in self.stack.procs.items():
            st = self.states.get(name, State())
            components[name] = {
                "pid": p.pid,
                "state": "restarting" if st.restart_at is not None else "running",
                "restarts": st.restarts,
                "lastExit": st.last_exit,
                "since": st.since,
            }
        doc = {"supervisor": os.getpid(), "updated": time.time(), "components": components}
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(self.status_file)

    def close(self) -> None:
        self.status_file.unlink(missing_ok=True)


def read_status(logs: Path) -> dict[str, Any] | None:
    """What the running stack's supervisor last wrote; None when no stack runs from ``logs``."""
    try:
        doc: dict[str, Any] = json.loads((logs / "stack.json").read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(int(doc["supervisor"]), 0)
    except (OSError, KeyError, ValueError):
        return None  # left by a stack that was killed
    return doc


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
