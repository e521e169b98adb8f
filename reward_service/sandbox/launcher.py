"""PID 1 of the sandbox's PID namespace (bwrap ``--as-pid-1``): starts the program and reaps everything.

Run as ``python -I -S -c <this source> <config-json>`` inside the sandbox; only the standard library. bwrap's
own init would do the reaping, but its monitor exits without waiting for it, so the CPU time of the run would
be lost; as PID 1 this launcher waits for every process of the run (orphans are re-parented to it), kills
what is left once the program exits, and so the sandbox's wait status and rusage cover the whole run.

Steps: become non-dumpable (the program, same uid, cannot ptrace or read /proc of it); fork the program with
the rlimits (config ``limits``: name → [soft, hard]) and ``execve`` it with an empty environment; take the
same limits itself; reap until the program exits; SIGKILL every other process of the namespace; reap them.
Exit status: the program's exit code, or ``128 + signal`` when a signal killed it.
"""

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys

PR_SET_DUMPABLE = 4


def set_limits(limits):
    for name, (soft, hard) in limits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


def main():
    config = json.loads(sys.argv[1])
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    pid = os.fork()
    if pid == 0:
        try:
            set_limits(config["limits"])
            os.execve(config["argv"][0], config["argv"], {})
        finally:
            os._exit(127)
    set_limits(config["limits"])
    while True:
        done, status = os.waitpid(-1, 0)
        if done == pid:
            break
    with contextlib.suppress(ProcessLookupError):  # raised when nothing is left
        os.kill(-1, signal.SIGKILL)  # everything but PID 1 in this namespace
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


main()
