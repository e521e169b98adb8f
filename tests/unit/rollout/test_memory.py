"""What GetStatus reports of memory: the RSS of the service's whole process tree (vLLM runs its engine and
workers in child processes), found without reading every process on the host."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from rollout_service import memory

# A child that starts a grandchild, then waits: a tree of depth two below this process.
TREE = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " + (
    "import time; time.sleep(60)"
)


def test_the_tree_holds_the_process_and_every_descendant():
    child = subprocess.Popen([sys.executable, "-c", TREE])
    try:
        me = psutil.Process()
        for _ in range(600):  # until the grandchild is up
            if psutil.Process(child.pid).children():
                break
            time.sleep(0.05)
        [grandchild] = psutil.Process(child.pid).children()
        assert {p.pid for p in memory.process_tree(child.pid)} == {child.pid, grandchild.pid}
        # This process may have other children (a test run's workers), which come and go.
        assert {me.pid, child.pid, grandchild.pid} <= {p.pid for p in memory.process_tree(os.getpid())}
        # Two Python interpreters hold several MiB each on top of this process.
        assert memory.process_tree_rss() > me.memory_info().rss + 2 * 4 * 2**20
    finally:
        for process in psutil.Process(child.pid).children(recursive=True):
            process.kill()
        child.kill()
        child.wait()


def test_a_process_that_ended_is_left_out():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert child.pid not in {p.pid for p in memory.process_tree(os.getpid())}
