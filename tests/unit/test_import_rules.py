"""The trainer service's layering, checked on the source (AST) and on a fresh interpreter.

Layers, lowest first; a module may import its own layer and the ones below, never one above:

    0  config/, core/types.py, settings.py      plain configuration and domain types (no torch, TRL, gRPC)
    1  local/, client.py                         starting local services, the progress bar; TrainerClient
    2  rollout/                                  TRL's rollout_func, async prefetch, weight sync, replicas
    3  training/                                 the job, builders, loss variants, importance sampling
    4  core/ (runs, worker)                      runs in worker processes
    5  api/                                      servicer and protobuf converters
    6  server.py, cli.py, check.py, __main__.py  entry points
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trainer_service"

# Longest prefix wins: trainer_service.core.types is layer 0 although trainer_service.core is layer 4.
LAYERS = {
    "trainer_service": 0,
    "trainer_service.config": 0,
    "trainer_service.core.types": 0,
    "trainer_service.settings": 0,
    "trainer_service.local": 1,
    "trainer_service.client": 1,
    "trainer_service.rollout": 2,
    "trainer_service.training": 3,
    "trainer_service.core": 4,
    "trainer_service.api": 5,
    "trainer_service.server": 6,
    "trainer_service.cli": 6,
    "trainer_service.check": 6,
    "trainer_service.__main__": 6,
}
HEAVY = ("torch", "trl", "transformers", "peft", "accelerate", "datasets", "vllm")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    best = max((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")), key=len)
    return LAYERS[best]


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every import statement in the file, including ones inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            base = node.module or ""
            # `from trainer_service.training import losses` names the module trainer_service.training.losses.
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def own(imported: str) -> str | None:
    """The trainer_service module an import names (``from mod import name`` may name a function: mod)."""
    if not imported.startswith("trainer_service"):
        return None
    while imported not in MODULES and "." in imported:
        imported = imported.rsplit(".", 1)[0]
    return imported


def test_every_module_has_a_layer():
    assert MODULES
    for module in MODULES:
        layer(module)  # raises when no prefix matches


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_higher_layer(module):
    upward = []
    for line, imported in imports(MODULES[module]):
        target = own(imported)
        if target is not None and layer(target) > layer(module):
            upward.append(f"line {line}: {target} (layer {layer(target)})")
    assert not upward, f"{module} (layer {layer(module)}) imports upward: {upward}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) == 0))
def test_configuration_and_domain_types_import_nothing_heavy(module):
    heavy = [
        f"line {line}: {imported}"
        for line, imported in imports(MODULES[module])
        if imported.split(".")[0] in (*HEAVY, "grpc", "grpo")
    ]
    assert not heavy, f"{module} must stay importable without torch/TRL/gRPC: {heavy}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) < LAYERS["trainer_service.api"]))
def test_only_entry_points_use_the_api_package(module):
    """The servicer and converters are used by the server and the CLI, never by core or below (nor another
    service's api package: the trainer talks to the reward and rollout services through their clients)."""
    found = imports(MODULES[module])
    users = [f"line {line}: {imported}" for line, imported in found if ".api." in f".{imported}."]
    assert not users, f"{module} imports an api package: {users}"


SERVICES = ("reward_service", "rollout_service", "trainer_service")
CLIENTS = {service: ROOT / service / "client.py" for service in SERVICES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_the_trainer_reaches_other_services_only_through_their_clients(module):
    """The reward and rollout services are used through ``<service>.client`` (which re-exports the domain
    types and helpers it takes and returns), never through their servers' modules."""
    others = [
        f"line {line}: {imported}"
        for line, imported in imports(MODULES[module])
        if imported.split(".")[0] in ("reward_service", "rollout_service")
        and not (imported + ".").startswith(f"{imported.split('.')[0]}.client.")
    ]
    assert not others, f"{module} imports another service's internals: {others}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_grpc_errors_stay_inside_the_clients(module):
    """Callers catch the clients' ServiceCallError family; only gRPC's own layer handles grpc.RpcError."""
    if module in ("trainer_service.api.trainer", "trainer_service.server"):
        return
    assert "RpcError" not in MODULES[module].read_text(), f"{module} handles grpc.RpcError itself"


@pytest.mark.parametrize("service", SERVICES)
def test_clients_import_no_api_package(service):
    """A client converts its own side of each message: importing it never loads a server's api package."""
    found = imports(CLIENTS[service])
    users = [f"line {line}: {imported}" for line, imported in found if ".api." in f".{imported}."]
    assert not users, f"{service}.client imports an api package: {users}"


def test_importing_the_clients_loads_no_servicer():
    code = (
        "import json, sys\n"
        "import reward_service.client, rollout_service.client, trainer_service.client\n"
        f"loaded = [m for m in sys.modules if m.split('.')[0] in {SERVICES!r} and '.api' in m]\n"
        "print(json.dumps(sorted(loaded)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_importing_the_config_package_loads_no_torch_or_trl():
    code = (
        "import json, sys\n"
        "import trainer_service.config.run_config, trainer_service.config.variants\n"
        "import trainer_service.config.rollout_targets, trainer_service.core.types\n"
        "import trainer_service.settings\n"
        "config = trainer_service.config.run_config.parse_config("
        "{'base': 'm', 'data': {'train': 't.jsonl'}, 'training': {'grpo_variant': 'gspo'}})\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
