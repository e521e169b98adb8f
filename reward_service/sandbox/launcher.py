"""PID 1 of the sandbox's PID namespace (bwrap ``--as-pid-1``): runs the program once per test and reaps
everything.

Run as ``python -I -S -B -c <this source> <config-json>`` inside the sandbox; only the standard library.
Its stdin holds the tests' inputs one after another (config ``inputs``: [offset, length] of each). bwrap's
own init would reap, but its monitor exits without waiting for it, so the CPU time of a run would be lost;
as PID 1 this launcher waits for every process (orphans are re-parented to it), and so measures each
test's CPU time exactly and leaves no process of one test alive in the next.

Steps: become non-dumpable (the program, same uid, cannot ptrace it or read its /proc); take the run's
limits itself (not RLIMIT_CPU: the host bounds its wall time; not RLIMIT_FSIZE: a test's input may be
larger); then per test: fork; in the child write the test's input into a stdin file of its own, connect
pipes for stdout and stderr, take the limits plus the test's RLIMIT_CPU and ``execve`` the program with an
empty environment; read its output up to the caps until it exits, overflows or reaches the wall limit;
SIGKILL every other process of the namespace; reap them; report.

Report on stdout, per test: one JSON line ``{"status", "limit", "cpu_s", "cpu_limit_s", "wall_s",
"out", "err"}`` then ``out`` bytes of its stdout and ``err`` bytes of the end of its stderr. ``status``
is the program's wait status; ``limit`` is what ended it: "wall", "output", "cpu" (RLIMIT_CPU) or "".

A later test runs in the same sandbox only when nothing of the earlier ones is left that it could see:
no file or change in /tmp, no System V IPC object, no key in the user keyrings (POSIX message queues are
refused by RLIMIT_MSGQUEUE 0); otherwise, or once the run has lasted ``batch_wall_s``, once its CPU grant
cannot cover a test's allowance, or (``stop_at_timeout``) after a test that hit the wall or CPU limit,
the launcher exits and the host starts the remaining tests in a fresh sandbox.
"""

import contextlib
import ctypes
import json
import math
import os
import resource
import select
import signal
import sys
import time

PR_SET_DUMPABLE = 4
WORKDIR = "/tmp"
READ_BYTES = 65536
# System V IPC "info" commands and where their count of existing objects is (ints into the struct).
SHM_INFO, SEM_INFO, MSG_INFO = 14, 19, 12
KEYCTL_READ, KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = 11, -4, -5
KEYCTL_GET_PERSISTENT, KEY_SPEC_PROCESS_KEYRING = 22, -2
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}


def set_limits(limits):
    for name, (soft, hard) in limits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


def children_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Leftovers:
    """What a test could leave for the next one in this sandbox, as a comparable snapshot."""

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long
        self.keyctl = SYS_KEYCTL.get(os.uname().machine)
        self.buffer = ctypes.create_string_buffer(4096)
        self.keyrings = [KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING]
        if self.keyctl is not None:
            # Linked into the launcher's own process keyring, which no child inherits.
            persistent = self.libc.syscall(self.keyctl, KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_PROCESS_KEYRING)
            self.keyrings += [persistent] if persistent > 0 else []

    def _ipc_count(self, call, index):
        ctypes.memset(self.buffer, 0, 64)
        if call() < 0:
            return -ctypes.get_errno()
        return int.from_bytes(self.buffer.raw[4 * index : 4 * index + 4], sys.byteorder)

    def _keys(self, keyring):
        n = self.libc.syscall(self.keyctl, KEYCTL_READ, keyring, self.buffer, len(self.buffer))
        return self.buffer.raw[: min(n, len(self.buffer))] if n >= 0 else -ctypes.get_errno()

    def snapshot(self):
        """None where this machine's keyrings cannot be read: then no test shares a sandbox."""
        if self.keyctl is None:
            return None
        tmp = os.stat(WORKDIR)
        libc, buf = self.libc, self.buffer
        return (
            sorted(os.listdir(WORKDIR)),
            (tmp.st_mode, tmp.st_uid, tmp.st_gid, tmp.st_nlink, tmp.st_mtime_ns, tmp.st_ctime_ns),
            self._ipc_count(lambda: libc.shmctl(0, SHM_INFO, buf), 0),
            self._ipc_count(lambda: libc.semctl(0, 0, SEM_INFO, buf), 7),
            self._ipc_count(lambda: libc.msgctl(0, MSG_INFO, buf), 0),
            [self._keys(k) for k in self.keyrings],
        )


def start_program(config, cpu_limit_s, offset, length, out_w, err_w):
    """Forks the program: its own input as stdin (read from the launcher's stdin, not shared with it)."""
    pid = os.fork()
    if pid:
        return pid
    try:
        stdin = os.memfd_create("stdin", 0)
        done = 0
        while done < length:
            chunk = os.pread(0, min(1 << 20, length - done), offset + done)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(stdin, view) :]
            done += len(chunk)
        os.lseek(stdin, 0, os.SEEK_SET)
        for fd, target in ((stdin, 0), (out_w, 1), (err_w, 2)):
            os.dup2(fd, target)
        os.closerange(3, 1 << 20)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # ignored by the launcher; the program's as usual
        set_limits({**config["limits"], "RLIMIT_CPU": (cpu_limit_s, cpu_limit_s + 1)})
        os.execve(config["argv"][0], config["argv"], {})
    finally:
        os._exit(127)


def reap(pid, blocking):
    """Reaps children (all of them when ``blocking``); returns the wait status of ``pid`` if it was among."""
    status = None
    while True:
        try:
            done, st = os.waitpid(-1, 0 if blocking else os.WNOHANG)
        except ChildProcessError:
            return status
        if done == 0:
            return status
        if done == pid:
            status = st


class Output:
    """One stream of the program: the first ``cap`` bytes kept (stdout) or the last ``tail`` (stderr)."""

    def __init__(self, fd, cap, tail):
        self.fd, self.cap, self.tail = fd, cap, tail
        self.data = bytearray()
        self.total = 0

    def read(self):
        """False at end of file."""
        chunk = os.read(self.fd, READ_BYTES)
        self.total += len(chunk)
        if self.tail:
            self.data = (self.data + chunk)[-self.tail :]
        else:
            self.data += chunk[: max(0, self.cap - len(self.data))]
        return bool(chunk)

    def drain(self):
        """Reads to end of file (every writer is dead) or past the cap."""
        while self.total <= self.cap and self.read():
            pass


def run_test(config, cpu_limit_s, offset, length, wake_r):
    """Runs the program on one input; returns the report header and the output kept."""
    cap = config["max_output_bytes"]
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    cpu_before = children_cpu_s()
    start = time.monotonic()
    pid = start_program(config, cpu_limit_s, offset, length, out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    streams = {out_r: Output(out_r, cap, 0), err_r: Output(err_r, cap, config["tail_bytes"])}
    poller = select.poll()
    for fd in (out_r, err_r, wake_r):
        poller.register(fd, select.POLLIN)
    deadline = start + config["wall_timeout_s"]
    status, limit = None, ""
    while status is None:
        left = deadline - time.monotonic()
        if left <= 0:
            limit = "wall"
            break
        for fd, _ in poller.poll(math.ceil(left * 1000)):
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
            elif not streams[fd].read():
                poller.unregister(fd)
        if any(s.total > cap for s in streams.values()):
            limit = "output"
            break
        status = reap(pid, blocking=False)
    with contextlib.suppress(ProcessLookupError):  # raised when nothing is left
        os.kill(-1, signal.SIGKILL)  # everything but PID 1 in this namespace
    late = reap(pid, blocking=True)
    status = status if status is not None else late
    for stream in streams.values():
        if not limit:
            stream.drain()
        os.close(stream.fd)
        if stream.total > cap:
            limit = limit or "output"
    cpu_s = children_cpu_s() - cpu_before
    if not limit and os.WIFSIGNALED(status):
        hard_kill = os.WTERMSIG(status) == signal.SIGKILL and cpu_s >= cpu_limit_s
        if os.WTERMSIG(status) == signal.SIGXCPU or hard_kill:
            limit = "cpu"
    header = {
        "status": status,
        "limit": limit,
        "cpu_s": cpu_s,
        "cpu_limit_s": cpu_limit_s,
        "wall_s": time.monotonic() - start,
        "out": len(streams[out_r].data),
        "err": len(streams[err_r].data),
    }
    return header, bytes(streams[out_r].data) + bytes(streams[err_r].data)


def write_all(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def main():
    config = json.loads(sys.argv[1])
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # As PID 1 the launcher gets only the signals it handles: SIGCHLD wakes its loop, nothing ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    leftovers = Leftovers()
    clean = leftovers.snapshot()
    # Not RLIMIT_FSIZE: a forked test writes its whole input into its stdin file before taking its limits.
    set_limits({name: pair for name, pair in config["limits"].items() if name != "RLIMIT_FSIZE"})
    start = time.monotonic()
    charged_s, last_limit = 0.0, ""
    for i, (offset, length) in enumerate(config["inputs"]):
        if i and (
            time.monotonic() - start >= config["batch_wall_s"]
            or config["cpu_grant_s"] - charged_s < config["cpu_time_s"]
            or (config["stop_at_timeout"] and last_limit in ("wall", "cpu"))
            or clean is None
            or leftovers.snapshot() != clean
        ):
            break
        cpu_limit_s = config["first_cpu_limit_s"] if i == 0 else max(1, math.ceil(config["cpu_time_s"]))
        header, output = run_test(config, cpu_limit_s, offset, length, wake_r)
        write_all(json.dumps(header).encode() + b"\n" + output)
        killed = header["limit"] in ("wall", "output")  # its allowance is charged, as the host does
        charged_s += max(header["cpu_s"], cpu_limit_s) if killed else header["cpu_s"]
        last_limit = header["limit"]


main()
