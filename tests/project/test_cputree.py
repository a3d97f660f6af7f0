"""The benchmarks' CPU accounting (tests.bench.cputree): a component's CPU over a window holds
what its processes did in it, those that ended in it too, and each second once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.bench import cputree

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
# A first child burns 0.3 s before the first snapshot and 0.3 s after it, and is reaped; then a
# second burns 0.5 s, starting and ending between the snapshots. The parent says when each part
# is done, then waits to be stopped.
PARENT = f"""
import subprocess, sys
first = subprocess.Popen([sys.executable, "-c", {BURN.format(s=0.3)!r} + "print('burnt', flush=True)\\n"
                          + "import sys; sys.stdin.readline()\\n" + {BURN.format(s=0.3)!r}],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
assert first.stdout.readline().strip() == b"burnt"
print("started", flush=True)
sys.stdin.readline()
first.communicate(b"go\\n")
subprocess.run([sys.executable, "-c", {BURN.format(s=0.5)!r}], check=True)
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.mark.server
def test_a_window_counts_what_ended_in_it_and_each_second_once() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdin is not None and parent.stdout is not None
        assert parent.stdout.readline().strip() == "started"
        before = cputree.snapshot({"c": parent.pid})
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "done"
        spent = cputree.spent(before, cputree.snapshot({"c": parent.pid}))["c"]
        parent.stdin.write("stop\n")
        parent.stdin.flush()
    # 0.8 s burnt in the window, plus one interpreter's start and the first child's end. Leaving
    # out the first child's 0.3 s before the window (it was alive then) would make it 1.1 s;
    # leaving out what the reaped children burnt, about 0.
    assert 0.8 <= spent < 1.05, spent
