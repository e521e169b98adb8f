"""One protobuf <-> domain codec per service, below both of its users: the servicer (``api/``) and the client
map every message with it, the codec imports no servicer, so clients import no servicer (that no
``client.py`` imports an ``api`` package, on the source and in a fresh interpreter, is checked in
test_import_rules.py). And the rollout client loads torch only for a weight push."""

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
