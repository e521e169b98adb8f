"""In-sandbox launcher: runs as PID 1 of a fresh PID namespace and starts the untrusted program.

This file is executed with ``python -I -S -c <source> <config-json>`` inside
``unshare --user --map-root-user --net --pid --fork --mount-proc``; it imports only the standard library and
must not import the reward service (the sandbox user may not be able to read it).

Steps, in order:
1. (namespaced mode) mount size-limited tmpfs over ``/tmp``, ``/var/tmp`` and ``/dev/shm`` so the program
   has a private scratch space, then enter a nested user + mount namespace so those mounts become *locked*:
   the program, root only inside its namespace, cannot unmount them to reach the host's world-writable dirs.
2. write the program to ``<scratch>/main.py`` and ``chdir`` there.
3. fork; the child applies the rlimits (CPU, AS, FSIZE, NOFILE, NPROC, CORE=0) and ``execve``s the interpreter
   with an empty environment; PID 1 reaps every process until the program exits, then exits itself, which
   makes the kernel kill everything left in the PID namespace (daemons included).

Exit status: the program's exit code, or ``128 + signal`` when a signal killed it.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_NOSUID = 0x2
MS_NODEV = 0x4


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(libc, target, size_mb):
    data = f"size={size_mb}m,mode=1777".encode()
    if libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {target}: {os.strerror(err)}")


def _lock_mounts(libc):
    """Nested user+mount namespace: mounts made by the parent namespace can no longer be unmounted."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def _set_limits(limits):
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def main():
    config = json.loads(sys.argv[1])
    if config["namespaces"]:
        libc = _libc()
        for target in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(target):
                _mount_tmpfs(libc, target, config["tmp_size_mb"])
        _lock_mounts(libc)
        workdir = "/tmp/work"
        os.mkdir(workdir)
    else:
        workdir = config["workdir"]
    path = os.path.join(workdir, "main.py")
    with open(path, "w") as f:
        f.write(config["program"])
    os.chdir(workdir)

    pid = os.fork()
    if pid == 0:
        try:
            _set_limits(config["limits"])
            python = config["python"]
            os.execve(python, [python, "-I", "-S", "-B", "main.py"], {})
        finally:
            os._exit(127)

    # PID 1: reap everything (orphans are re-parented here) until the program itself exits.
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if done == pid:
            break
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


main()
