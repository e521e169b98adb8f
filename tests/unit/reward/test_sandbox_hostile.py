"""Hostile programs against the real sandbox: each is contained, leaves nothing on the host, no process.

All programs run once, concurrently, in a module fixture (a few seconds in all); each test then checks one
program's result. A program prints ESCAPED when the thing it tried worked; secrets sit in a host file
readable by the sandbox's uid, in a fake secrets dir and in the service's environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from reward_service.sandbox.runner import RunResult, SandboxRunner, open_runner
from reward_service.sandbox.settings import SandboxSettings

REPO = Path(__file__).resolve().parents[3]
SECRET = f"grpo-hostile-secret-{os.getpid()}"
MARKER = f"grpo-hostile-{os.getpid()}-{time.monotonic_ns()}"
# A uid of their own when the tests run as root, so that a stray sandbox process is found by its uid.
RUN_UID = 61000 + os.getpid() % 1000 if os.geteuid() == 0 else None
SETTINGS = SandboxSettings(
    wall_timeout_s=3,
    cpu_time_s=2,
    memory_mb=512,
    max_processes=8,
    tmp_size_mb=16,
    max_file_mb=8,
    concurrency=4,
    run_as_uid=RUN_UID,
)
PER_PROCESS_MB = SETTINGS.process_memory_bytes() // 2**20


def world_writable_dirs() -> list[str]:
    """Host dirs anyone may write to (the usual ones and any at depth 1 of /run, /var, /dev)."""
    found = set()
    candidates = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/dev/mqueue"]
    for root in ("/run", "/var", "/dev"):
        with contextlib.suppress(OSError):
            candidates += [str(p) for p in Path(root).iterdir()]
    for path in candidates:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode) and mode & stat.S_IWOTH:
            found.add(path)
    return sorted(found)


WRITABLE = world_writable_dirs()
HOME = os.path.expanduser("~")
SANDBOX_NAMES = {"usr", "bin", "lib", "lib64", "tmp", "dev", "proc", "main.py"}
try:
    HOME_ENTRIES = set(os.listdir(HOME)) - SANDBOX_NAMES
except OSError:
    HOME_ENTRIES = set()


@dataclass
class Host:
    """What the programs attack."""

    secret_file: Path
    secrets_dir: Path
    open_dir: Path
    port: int
    service_pid: int


def programs(host: Host) -> dict[str, str]:
    secret_path = str(host.secret_file)
    fake_token = str(host.secrets_dir / "admin_token")
    read = (
        "import sys\ntry:\n    print(open({path!r}).read()); print('ESCAPED')\nexcept OSError as e:\n    "
        "sys.exit(f'refused: {{e}}')"
    )
    listdir = (
        "import os, sys\ntry:\n    print(os.listdir({path!r})); print('ESCAPED')\nexcept OSError as e:\n    "
        "sys.exit(f'refused: {{e}}')"
    )
    spawn_marker = (
        f"os.execv('/usr/bin/python3', ['python3', '-c', 'import time; time.sleep(60)', '{MARKER}'])"
    )
    out = {
        # Secrets and the service's files
        "read_secret_file": read.format(path=secret_path),
        "read_fake_run_secrets": read.format(path=fake_token),
        "read_run_secrets": read.format(path="/run/secrets/admin_token"),
        "read_etc_shadow": read.format(path="/etc/shadow"),
        "read_service_source": read.format(path=str(REPO / "reward_service" / "server.py")),
        "list_models": listdir.format(path=str(REPO / "tiny_models")),
        "list_service_venv": listdir.format(path=str(REPO / ".venv")),
        # $HOME may be a dir the sandbox has too (/ or /tmp in a container): only the host's entries count.
        "list_home": f"import os\nhost = {HOME_ENTRIES!r}\ntry:\n    seen = set(os.listdir({HOME!r}))\n"
        "except OSError:\n    seen = set()\nprint(sorted(seen & host))\nif seen & host:\n"
        "    print('ESCAPED')",
        "list_root_home": listdir.format(path="/root"),
        "list_run": listdir.format(path="/run"),
        "list_var": listdir.format(path="/var"),
        "list_etc": listdir.format(path="/etc"),
        "list_sys": listdir.format(path="/sys"),
        "root_is_minimal": "import os\nextra = set(os.listdir('/')) - {'usr', 'bin', 'lib', 'lib64', 'tmp', "
        "'dev', 'proc'}\nprint(sorted(extra))\nif extra:\n    print('ESCAPED')",
        # LC_CTYPE is the interpreter's own locale coercion (PEP 538); nothing else may be there.
        "environment": "import os\nprint(dict(os.environ))\nif set(os.environ) - {'LC_CTYPE'}:\n"
        "    print('ESCAPED')",
        # /proc of the service
        "proc_1_environ": read.format(path="/proc/1/environ"),
        "proc_parent": "import os\nprint(open(f'/proc/{os.getppid()}/environ').read())\n"
        "print(open(f'/proc/{os.getppid()}/cmdline').read())",
        "proc_service_pid": read.format(path=f"/proc/{host.service_pid}/environ"),
        "proc_scan_all": "import os\nfor p in os.listdir('/proc'):\n    for f in ('environ', 'cmdline'):\n"
        "        try:\n            print(open(f'/proc/{p}/{f}', 'rb').read())\n        except OSError:\n"
        "            pass",
        "proc_root_escape": read.format(path=f"/proc/1/root{secret_path}"),
        "proc_sysrq": "import sys\ntry:\n    open('/proc/sysrq-trigger', 'w').write('h'); print('ESCAPED')\n"
        "except OSError as e:\n    sys.exit(f'refused: {e}')",
        # Writes outside the private tmp
        "write_usr": f"open('/usr/{MARKER}', 'w').write('x')\nprint('ESCAPED')",
        "write_root": f"open('/{MARKER}', 'w').write('x')\nprint('ESCAPED')",
        "write_open_host_dir": f"open({str(host.open_dir / MARKER)!r}, 'w').write('x')\nprint('ESCAPED')",
        "symlink_out": f"import os\nos.symlink({secret_path!r}, '/tmp/link')\n"
        "print(open('/tmp/link').read())\nprint('ESCAPED')",
        "unix_socket_in_every_dir": "import socket\n"
        f"for d in {WRITABLE!r} + ['/tmp']:\n"
        "    try:\n        s = socket.socket(socket.AF_UNIX)\n"
        f"        s.bind(d + '/{MARKER}.sock')\n        s.listen(1)\n    except OSError:\n        pass\n"
        "import time\ntime.sleep(0.5)",
        "abstract_unix_socket": "import socket, time\ns = socket.socket(socket.AF_UNIX)\n"
        f"s.bind('\\0{MARKER}')\ns.listen(1)\ntime.sleep(0.5)",
        "fill_tmp": "import os\nn = 0\ntry:\n    for i in range(100):\n"
        "        with open(f'/tmp/f{i}', 'wb') as f:\n            f.write(b'0' * (4 << 20))\n        n += 4\n"
        f"except OSError:\n    pass\nprint(n)\nif n > {SETTINGS.tmp_size_mb}:\n    print('ESCAPED')",
        "huge_file": "with open('/tmp/big', 'wb') as f:\n    while True:\n        f.write(b'0' * (1 << 20))",
        # Processes, memory, signals
        "memory_spread_over_processes": "import os\nheld = 0\nkids = []\nfor i in range(12):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n"
        "        try:\n            x = bytearray(200 * 2**20)\n            os._exit(0)\n"
        "        except MemoryError:\n            os._exit(1)\n    kids.append(pid)\n"
        "for pid in kids:\n    held += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0\n"
        f"print(held)\nif held * 200 > {SETTINGS.memory_mb}:\n    print('ESCAPED')",
        "memory_bomb": "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 2**20))",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "fork_storm_count": "import os, time\nn = 0\nfor i in range(200):\n    try:\n"
        f"        if os.fork() == 0:\n            {spawn_marker}\n        n += 1\n    except OSError:\n"
        f"        break\nprint(n)\nif n >= {SETTINGS.max_processes}:\n    print('ESCAPED')",
        "thread_storm": "import threading, time\nn = 0\ntry:\n    for i in range(500):\n"
        "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n        n += 1\n"
        f"except RuntimeError:\n    pass\nprint(n)\nif n >= {SETTINGS.max_processes}:\n    print('ESCAPED')",
        "kill_all": "import os, signal, time\nos.kill(-1, signal.SIGKILL)\ntime.sleep(0.2)\nprint('alive')",
        "kill_parent_and_init": "import os, signal\nfor pid in (os.getppid(), 1):\n    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\nprint('alive')",
        # A service that is PID 1 or 2 of its container shares the number with the sandbox's own processes.
        "kill_service_pid": f"import os\ntry:\n    os.kill({host.service_pid}, 9)\n"
        f"    print('ESCAPED' if {host.service_pid} > 2 else 'own process')\n"
        "except OSError as e:\n    print('refused', e)",
        "ptrace_init": "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.ptrace(16, 1, 0, 0) == 0:\n    print('ESCAPED')\nelse:\n    sys.exit('ptrace refused')",
        "new_user_namespace": "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.unshare(0x10000000) == 0:\n    print('ESCAPED')\nelse:\n    sys.exit('unshare refused')",
        "nested_namespace_tmpfs": "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.unshare(0x10000000 | 0x20000) != 0:\n    sys.exit('unshare refused')\n"
        "os.makedirs('/tmp/x')\nif libc.mount(b'tmpfs', b'/tmp/x', b'tmpfs', 0, b'size=1g') != 0:\n"
        "    sys.exit('mount refused')\nopen('/tmp/x/f', 'wb').write(b'0' * 2**20)\nprint('ESCAPED')",
        "unmount_tmp": "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.umount2(b'/tmp', 2) == 0:\n    print('ESCAPED')\nelse:\n    sys.exit('umount refused')",
        "setuid_root": "import os, sys\ntry:\n    os.setuid(0)\n    print('ESCAPED')\nexcept OSError:\n"
        "    sys.exit('setuid refused')",
        "daemonize": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        {spawn_marker}\n    os._exit(0)\ntime.sleep(0.3)\nprint('parent done')",
        # Network
        "connect_host_listener": f"import socket\ns = socket.create_connection(('127.0.0.1', {host.port}), "
        "timeout=1)\ns.sendall(b'leak')\nprint('ESCAPED')",
        "network_interfaces": "import socket\nnames = [n for _, n in socket.if_nameindex()]\nprint(names)\n"
        "if names != ['lo']:\n    print('ESCAPED')",
        # Time and output
        "infinite_loop": "while True:\n    pass",
        "ignore_sigxcpu": "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
        "while True:\n    pass",
        "sleep_forever": "import time\ntime.sleep(10**6)",
        "output_flood": "while True:\n    print('x' * 4096)",
        "stderr_flood": "import sys\nsys.stderr.write(('y' * 1000 + '\\n') * 100 + 'z' * 100000)\n"
        "sys.exit(1)",
        "segfault": "import ctypes\nctypes.string_at(0)",
    }
    for i, path in enumerate(WRITABLE):
        out[f"write_world_writable_{i}_{path.strip('/').replace('/', '_')}"] = (
            f"open({path + '/' + MARKER!r}, 'w').write('x')\nprint(open({path + '/' + MARKER!r}).read())"
        )
    return out


# Failures expected of some programs (the others may fail or not; none may escape).
EXPECTED_FAILURE = {
    "infinite_loop": ("SIGXCPU", "timed out"),
    "ignore_sigxcpu": ("SIGKILL", "timed out"),
    "sleep_forever": ("timed out",),
    "output_flood": ("output exceeded",),
    "segfault": ("SIGSEGV",),
    "huge_file": ("File too large",),  # Python ignores SIGXFSZ: the write fails with EFBIG
    "memory_bomb": ("MemoryError", "timed out"),
    "ptrace_init": ("ptrace refused",),
    "new_user_namespace": ("unshare refused",),  # where bwrap may refuse nested namespaces (see below)
    "unmount_tmp": ("umount refused",),
    "setuid_root": ("setuid refused",),
    "connect_host_listener": ("exit code 1",),
}


def _host(tmp_path_factory) -> Host:
    base = tmp_path_factory.mktemp("hostile")
    base.chmod(0o755)
    secret_file = base / "secret.txt"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o644)  # readable by the sandbox's uid: only the sandbox's root keeps it out
    secrets_dir = base / "secrets"
    secrets_dir.mkdir(mode=0o755)
    (secrets_dir / "admin_token").write_text(SECRET)
    (secrets_dir / "admin_token").chmod(0o644)
    open_dir = base / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    return Host(secret_file, secrets_dir, open_dir, 0, os.getpid())


def _sandbox_processes() -> list[psutil.Process]:
    """Processes a run may have left: of the runs' uid, or with the marker on their command line."""
    left = []
    for proc in psutil.process_iter(["cmdline", "uids"]):
        try:
            if (RUN_UID is not None and proc.info["uids"].real == RUN_UID) or MARKER in " ".join(
                proc.info["cmdline"] or []
            ):
                left.append(proc)
        except (psutil.Error, TypeError):
            pass
    return left


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    """Runs every program (the service's environment holds the secret) and the host checks after them."""
    host = _host(tmp_path_factory)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    host.port = listener.getsockname()[1]
    table = programs(host)
    assert len(table) >= 30
    previous = os.environ.get("GRPO_ADMIN_TOKEN")
    os.environ["GRPO_ADMIN_TOKEN"] = SECRET
    try:

        async def run_all() -> tuple[dict[str, RunResult], float]:
            runner, status = await open_runner(SETTINGS)
            assert runner is not None, f"the sandbox cannot run here: {status}"
            assert isinstance(runner, SandboxRunner)
            start = time.monotonic()
            results = await asyncio.gather(*(runner.run(p) for p in table.values()))
            results = dict(zip(table, results, strict=True))
            return results, time.monotonic() - start, runner.backend.options.disable_userns

        results, elapsed, disable_userns = asyncio.run(run_all())
    finally:
        if previous is None:
            os.environ.pop("GRPO_ADMIN_TOKEN", None)
        else:
            os.environ["GRPO_ADMIN_TOKEN"] = previous
    time.sleep(0.2)
    try:
        connection = listener.accept()
    except BlockingIOError:
        connection = None
    listener.close()
    left_on_host = [
        str(p) for d in [*WRITABLE, str(host.open_dir), "/usr", "/"] for p in Path(d).glob(f"{MARKER}*")
    ]
    unix_sockets = [line for line in Path("/proc/net/unix").read_text().splitlines() if MARKER in line]
    return {
        "results": results,
        "elapsed": elapsed,
        "connection": connection,
        "left_on_host": left_on_host,
        "unix_sockets": unix_sockets,
        "stray": _sandbox_processes(),
        "secret_file": host.secret_file,
        "disable_userns": disable_userns,
    }


NAMES = list(programs(Host(Path("/x"), Path("/x"), Path("/x"), 1, 1)))


@pytest.mark.parametrize("name", NAMES)
def test_hostile_program_is_contained(outcome, name):
    result = outcome["results"][name]
    print(f"{name}: {result.failure or result.stdout[:200]!r}")
    if name == "new_user_namespace" and not outcome["disable_userns"]:
        pytest.skip("bwrap --disable-userns is refused here (Docker): nested_namespace_tmpfs checks the rest")
    assert "ESCAPED" not in result.stdout, (name, result)
    assert SECRET not in result.stdout and SECRET not in result.failure, name
    assert len(result.failure.encode()) <= SETTINGS.error_excerpt_bytes + 64
    assert result.duration_s < SETTINGS.wall_timeout_s + 5
    if name in EXPECTED_FAILURE:
        assert any(reason in result.failure for reason in EXPECTED_FAILURE[name]), (name, result.failure)


def test_nothing_is_left_on_the_host(outcome):
    assert outcome["left_on_host"] == []
    assert outcome["unix_sockets"] == []
    assert outcome["connection"] is None
    assert outcome["secret_file"].read_text() == SECRET


def test_no_process_outlives_its_run(outcome):
    assert outcome["stray"] == []


def test_the_whole_suite_is_bounded(outcome):
    # 50-odd programs, 4 at a time, the slow ones cut at 3 s: far below their sum of limits.
    assert outcome["elapsed"] < 60, outcome["elapsed"]
    # The runs that obeyed were quick: start-up of the sandbox is not the bottleneck.
    assert outcome["results"]["network_interfaces"].duration_s < 3
