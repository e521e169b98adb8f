"""One protobuf <-> domain codec per service, below both of its users: the servicer (``api/``) and the client
map every message with it, the codec imports no servicer, so clients import no servicer (that no
``client.py`` imports an ``api`` package, on the source and in a fresh interpreter, is checked in
test_import_rules.py). The environment contract (grpo.env.v1) is served by the reward service and called by
grpo_runtime's EnvironmentClient, so its codec sits in grpo_runtime, below every service, with the Struct
reader that the reward codec shares. And the rollout client loads torch only for a weight push."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("reward_service", "rollout_service", "trainer_service")
# The rollout's weight messages are a module of their own because their domain types import torch.
CODECS = {
    "reward_service": ("codec.py",),
    "rollout_service": ("codec.py", "weight_codec.py"),
    "trainer_service": ("codec.py",),
}
SERVICERS = {"reward_service": "reward.py", "rollout_service": "rollout.py", "trainer_service": "trainer.py"}
# grpo_runtime's codecs: the agent and environment contracts', and the Struct reader every codec reads
# requests with.
RUNTIME_CODECS = ("grpo_runtime/agent_codec.py", "grpo_runtime/env_codec.py", "grpo_runtime/struct_codec.py")


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names (``from a import b`` names ``a.b``), including
    imports inside functions and under ``if TYPE_CHECKING:``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "path", [f"{service}/{name}" for service, names in CODECS.items() for name in names], ids=str
)
def test_codecs_import_no_api_package(path):
    api = [module for module in imported_modules(ROOT / path) if ".api." in f".{module}."]
    assert not api, f"{path} imports a servicer package: {api}"


@pytest.mark.parametrize("path", RUNTIME_CODECS)
def test_runtime_codecs_import_no_service(path):
    services = [module for module in imported_modules(ROOT / path) if module.split(".")[0] in SERVICES]
    assert not services, f"{path} is below every service but imports {services}"


@pytest.mark.parametrize("service", SERVICES)
def test_the_servicer_and_the_client_map_messages_with_the_same_codec(service):
    codec = f"{service}.codec"
    for user in (ROOT / service / "api" / SERVICERS[service], ROOT / service / "client.py"):
        assert codec in imported_modules(user), f"{user.relative_to(ROOT)} does not map messages with {codec}"
    assert not (ROOT / service / "api" / "convert.py").exists(), (
        f"{service}/api/convert.py maps messages again"
    )


def test_importing_the_rollout_client_loads_no_torch():
    """Generating, sleeping and reading the status need no torch (seconds to import, and a CUDA context's
    memory on a GPU machine)."""
    assert run_python("import rollout_service.client, sys; print('torch' in sys.modules)") == "False"


def test_the_rollout_clients_weight_names_load_at_their_first_use():
    code = (
        "import sys\n"
        "import rollout_service.client\n"
        "before = 'torch' in sys.modules\n"
        "from rollout_service.client import GroupSpec, encode, plan_buckets\n"
        "print(before, 'torch' in sys.modules, GroupSpec.__name__, encode.__name__, plan_buckets.__name__)\n"
    )
    assert run_python(code).split() == ["False", "True", "GroupSpec", "encode", "plan_buckets"]


def test_an_unknown_name_of_the_rollout_client_is_still_an_attribute_error():
    code = (
        "import rollout_service.client as client\n"
        "try:\n"
        "    client.no_such_name\n"
        "except AttributeError as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    assert run_python(code) == "AttributeError"


def test_the_environment_servicer_and_client_map_messages_with_the_env_codec():
    for user in (ROOT / "reward_service/api/environment.py", ROOT / "grpo_runtime/env_client.py"):
        assert "grpo_runtime.env_codec" in imported_modules(user), (
            f"{user.relative_to(ROOT)} does not map messages with grpo_runtime.env_codec"
        )
    assert not (ROOT / "reward_service/api/env_convert.py").exists(), "api/env_convert.py maps messages again"


def test_the_struct_reader_is_shared_not_copied():
    """The reward codec reads metadata and params with grpo_runtime's reader (one set of NaN, nesting and
    size checks), and defines no reader of its own."""
    codec = ROOT / "reward_service/codec.py"
    assert "grpo_runtime.struct_codec.struct_dict" in imported_modules(codec)
    defined = {
        node.name for node in ast.walk(ast.parse(codec.read_text())) if isinstance(node, ast.FunctionDef)
    }
    copies = defined & {"struct_dict", "_fields", "_plain", "_items"}
    assert not copies, f"reward_service/codec.py defines its own Struct reader: {sorted(copies)}"
