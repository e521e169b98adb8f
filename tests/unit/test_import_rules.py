"""Each service's layering, checked on the source (AST) and on a fresh interpreter.

Layers, lowest first; a module may import its own layer and the ones below, never one above (longest prefix
wins: ``trainer_service.core.types`` is layer 0 although ``trainer_service.core`` is layer 4).

trainer_service:

    0  config/, core/types.py, settings.py      plain configuration and domain types (no torch, TRL, gRPC)
    1  local/, codec.py, client.py               starting local services, the progress bar; the protobuf
                                                 codec (both directions) and TrainerClient, which uses it
    2  rollout/                                  TRL's rollout_func, async prefetch, weight sync, replicas
    3  training/                                 the job, builders, loss variants, importance sampling
    4  core/ (runs, worker)                      runs in worker processes
    5  api/                                      the servicer (converting with codec.py)
    6  server.py, cli.py, check.py, __main__.py  entry points

reward_service:

    0  core/types.py                             domain types
    1  checkers/, sandbox/                       killable worker processes: math-verify, JSON schema,
                                                 reasoning-gym scoring; the code sandbox (they run jobs,
                                                 and know no reward)
    2  rewards/                                  the rule rewards, each submitting its jobs to layer 1
    3  judges/, models/                          remote judges, reward models
    4  core/ (scorer, stress, bounds)            scoring a request over the rewards
    5  environments/                             tool environments (episodes score through the scorer)
    6  codec.py, api/, client.py, adapters/      protobuf <-> domain, servicers; RewardClient and verl's
    7  http/                                     OpenRLHF's HTTP protocol
    8  settings.py, server.py, cli.py, __main__  the config model of every block, assembly, entry points

rollout_service:

    0  types.py, confined_files.py, settings.py  domain types, confined file access
       weight_plane/                             the weight data plane both sides share: payloads, buckets,
                                                 manifests, shared memory, torch.distributed (it imports no
                                                 core, engine or servicer, and nothing of the trainer's)
    1  memory.py, weights.py                     process memory; weight validation against the model
    2  engines/                                  generation engines (HF, vLLM) behind engines/base.py
    3  core/                                     the data plane over an engine (core imports engines, never
                                                 the other way round: engines see core's UpdatePause through
                                                 the engines.base.UpdatePause protocol)
       gateway/                                  the OpenAI-compatible gateway's sessions, prompts and
                                                 trajectories over the core (gateway/types.py: layer 0;
                                                 gateway/openai_codec.py, responses_codec.py, http_app.py:
                                                 layer 4)
    4  codec.py, weight_codec.py, api/, client.py  protobuf <-> domain, the servicer; RolloutClient
    5  server.py, __main__.py                    assembly, entry point

And in all three: no import cycle between modules (module-level imports; ``if TYPE_CHECKING:`` ones are
for annotations only and do not count).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("reward_service", "rollout_service", "trainer_service")
PACKAGE = ROOT / "trainer_service"

LAYERS = {
    "trainer_service": 0,
    "trainer_service.config": 0,
    "trainer_service.core.types": 0,
    "trainer_service.settings": 0,
    "trainer_service.local": 1,
    "trainer_service.codec": 1,
    "trainer_service.client": 1,
    "trainer_service.rollout": 2,
    "trainer_service.training": 3,
    "trainer_service.core": 4,
    "trainer_service.api": 5,
    "trainer_service.server": 6,
    "trainer_service.cli": 6,
    "trainer_service.check": 6,
    "trainer_service.__main__": 6,
    "reward_service": 0,
    "reward_service.core.types": 0,
    "reward_service.checkers": 1,
    "reward_service.sandbox": 1,
    "reward_service.rewards": 2,
    "reward_service.judges": 3,
    "reward_service.models": 3,
    "reward_service.core": 4,
    "reward_service.environments": 5,
    "reward_service.codec": 6,
    "reward_service.api": 6,
    "reward_service.client": 6,
    "reward_service.adapters": 6,
    "reward_service.http": 7,
    "reward_service.settings": 8,
    "reward_service.server": 8,
    "reward_service.cli": 8,
    "reward_service.__main__": 8,
    "rollout_service": 0,
    "rollout_service.types": 0,
    "rollout_service.weight_plane": 0,
    "rollout_service.confined_files": 0,
    "rollout_service.settings": 0,
    "rollout_service.memory": 1,
    "rollout_service.weights": 1,
    "rollout_service.engines": 2,
    "rollout_service.core": 3,
    "rollout_service.gateway": 3,
    "rollout_service.gateway.types": 0,
    "rollout_service.gateway.openai_codec": 4,
    "rollout_service.gateway.responses_codec": 4,
    "rollout_service.gateway.http_app": 4,
    "rollout_service.codec": 4,
    "rollout_service.weight_codec": 4,
    "rollout_service.api": 4,
    "rollout_service.client": 4,
    "rollout_service.server": 5,
    "rollout_service.__main__": 5,
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


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of the imports that run when the module is imported: at module level, in
    ``try``/``if`` blocks there, but not inside functions or classes, nor under ``if TYPE_CHECKING:``."""
    found: list[tuple[int, str]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
            elif isinstance(node, ast.If):
                if not is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                    visit(block)

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    return found


ALL_MODULES = {
    module_name(path): path for service in SERVICES for path in sorted((ROOT / service).rglob("*.py"))
}
MODULES = {module: path for module, path in ALL_MODULES.items() if module.split(".")[0] == "trainer_service"}


def own(imported: str) -> str | None:
    """The module of one of the services an import names (``from mod import name`` may name a function:
    mod)."""
    if imported.split(".")[0] not in SERVICES:
        return None
    while imported not in ALL_MODULES and "." in imported:
        imported = imported.rsplit(".", 1)[0]
    return imported


def same_service(a: str, b: str) -> bool:
    return a.split(".")[0] == b.split(".")[0]


def test_every_module_has_a_layer():
    for service in SERVICES:
        assert any(module.split(".")[0] == service for module in ALL_MODULES), service
    for module in ALL_MODULES:
        layer(module)  # raises when no prefix matches


@pytest.mark.parametrize("module", sorted(ALL_MODULES))
def test_no_module_imports_a_higher_layer(module):
    upward = []
    for line, imported in imports(ALL_MODULES[module]):
        target = own(imported)
        if target is not None and same_service(target, module) and layer(target) > layer(module):
            upward.append(f"line {line}: {target} (layer {layer(target)})")
    assert not upward, f"{module} (layer {layer(module)}) imports upward: {upward}"


ENGINES = sorted(m for m in ALL_MODULES if m.startswith("rollout_service.engines."))


@pytest.mark.parametrize("module", ENGINES)
def test_rollout_engines_never_import_the_core(module):
    """The core drives an engine (``core -> engines``); an engine sees only the types, weights and the
    ``engines.base`` interface, so it can be changed, or a new one written, without reading the core."""
    core = [
        f"line {line}: {imported}"
        for line, imported in imports(ALL_MODULES[module])
        if (imported + ".").startswith("rollout_service.core.")
    ]
    assert not core, f"{module} imports the core: {core}"


WEIGHT_PLANE = sorted(m for m in ALL_MODULES if m.startswith("rollout_service.weight_plane"))
# What the weight data plane must not know: the replica's server side, and the trainer.
ABOVE_THE_WEIGHT_PLANE = (
    "rollout_service.core.",
    "rollout_service.engines.",
    "rollout_service.api.",
    "rollout_service.server.",
    "trainer_service.",
)


@pytest.mark.parametrize("module", WEIGHT_PLANE)
def test_the_weight_plane_knows_neither_the_replica_nor_the_trainer(module):
    """Both sides send and receive weights with the same package, so it holds the contract alone: the
    replica's core, engines and servicer and the trainer use it, never the other way round."""
    found = [
        f"line {line}: {imported}"
        for line, imported in imports(ALL_MODULES[module])
        if (imported + ".").startswith(ABOVE_THE_WEIGHT_PLANE)
    ]
    assert not found, f"{module} imports a user of the weight plane: {found}"


def test_the_rollout_client_loads_the_weight_plane_at_a_push_and_no_server_module():
    """Importing the client loads neither torch nor the weight plane; what a push needs (the plane's names
    and the weight codec) loads torch and the plane, and still no core, engine or servicer module."""
    code = (
        "import json, sys\n"
        "import rollout_service.client as client\n"
        "def loaded(*prefixes):\n"
        "    return sorted(m for m in sys.modules if (m + '.').startswith(prefixes))\n"
        "before = loaded('torch.', 'rollout_service.weight_plane.')\n"
        "client.encode, client.plan_buckets, client.BucketFiles, client.GroupSpec\n"
        "import rollout_service.weight_codec\n"
        f"server = loaded(*{ABOVE_THE_WEIGHT_PLANE[:4]!r})\n"
        "print(json.dumps([before, 'torch' in sys.modules, server]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[], True, []]


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the services that importing it imports (module-level, see above),
    including the packages above each (importing ``a.b.c`` runs ``a/b/__init__.py`` first)."""
    graph: dict[str, set[str]] = {}
    for module, path in ALL_MODULES.items():
        targets = set()
        for _, imported in module_level_imports(path):
            target = own(imported)
            while target is not None:
                if target in ALL_MODULES and target != module:
                    targets.add(target)
                target = target.rsplit(".", 1)[0] if "." in target else None
        graph[module] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm), each as a closed
    path through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(start: str) -> None:
        # Iterative depth-first search: (module, its remaining successors).
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            module, successors = work[-1]
            for target in successors:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in stack:
                    low[module] = min(low[module], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        cycles.append(closed_path(graph, set(component)))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return cycles


def closed_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A cycle inside ``component`` from its first module back to it (breadth-first, so a shortest one)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph[module] & component):
                if target == start:
                    path = [module]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if target not in came_from:
                    came_from[target] = module
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def test_no_import_cycles():
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]


def test_type_checking_imports_are_not_module_level(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import typing\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import reward_service.checkers.pool\n"
        "if typing.TYPE_CHECKING:\n    import reward_service.rewards\n"
        "try:\n    import rollout_service.types\nexcept ImportError:\n    pass\n"
        "def f():\n    import trainer_service.core\n"
    )
    assert [imported for _, imported in module_level_imports(source)] == [
        "typing",
        "typing.TYPE_CHECKING",
        "rollout_service.types",
    ]


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
        "{'base': 'm', 'data': {'train': 't.jsonl'}, 'training': {'loss': {'variant': 'gspo'}}})\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
