"""docs/api.md cannot drift from the protos, and the request bodies shown in the docs are valid messages."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_health.v1 import health_pb2
from grpo.common.v1 import common_pb2
from grpo.reward.v1 import reward_pb2
from grpo.rollout.v1 import rollout_pb2
from grpo.trainer.v1 import trainer_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "gen_api_docs.py"
API_MD = REPO_ROOT / "docs" / "api.md"
FILES = (reward_pb2, rollout_pb2, trainer_pb2)


def _load_generator(monkeypatch):
    # The script imports its sibling modules from its own directory, as when run as a script.
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gen_api_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class body runs.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_checked_in_api_reference_matches_the_protos():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"run `python scripts/gen_api_docs.py`:\n{result.stderr[-3000:]}"


def test_check_mode_fails_on_a_stale_reference(tmp_path, monkeypatch):
    stale = tmp_path / "api.md"
    stale.write_text(API_MD.read_text().replace("Scores every sample", "Scores some samples"))
    generator = _load_generator(monkeypatch)
    assert generator.main(["--check", "--out", str(stale)]) == 1
    assert generator.main(["--out", str(stale)]) == 0
    assert stale.read_text() == API_MD.read_text()


def test_every_rpc_message_and_field_is_documented_with_its_admin_flag():
    text = API_MD.read_text()
    for module in FILES:
        for service in module.DESCRIPTOR.services_by_name.values():
            assert f"### Service `{service.full_name}`" in text
            assert f"Status codes a client of `{service.name}` can receive" in text
            for method in service.methods:
                admin = method.GetOptions().Extensions[common_pb2.admin]
                row = re.search(rf"^\| `{method.name}` \|.*$", text[text.index(service.full_name) :], re.M)
                assert row, f"{service.full_name}/{method.name} missing"
                assert ("| **yes** |" in row.group(0)) == admin, row.group(0)
        for message in module.DESCRIPTOR.message_types_by_name.values():
            section = text[text.index(f"#### `{message.full_name}`") :]
            for field in message.fields:
                assert re.search(rf"^\| `{field.name}` \| {field.number} \|", section, re.M), field.full_name
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            section = text[text.index(f"#### enum `{enum.full_name}`") :]
            for value in enum.values:
                assert f"| `{value.name}` | {value.number} |" in section
    # Retry advice: what to retry and what never to.
    assert "| `UNAVAILABLE` | Retry with backoff" in text
    assert "| `RESOURCE_EXHAUSTED` | Retry only when the status carries the `grpc-retry-pushback-ms`" in text
    assert "| `RESOURCE_EXHAUSTED` | runtime / transport | only with `grpc-retry-pushback-ms` |" in text
    assert "| `INVALID_ARGUMENT` | Never retry" in text


# grpcurl calls in the docs: -d '<json>' ... host:port package.Service/Method
GRPCURL_CALL = re.compile(r"-d '(\{.*?\})'[^\n]*?(?:\\\n[^\n]*?)*?\s\S+:\d+ ([\w.]+)/(\w+)", re.S)


def _request_class(service: str, method: str):
    pool = descriptor_pool.Default()
    descriptor = pool.FindServiceByName(service).FindMethodByName(method).input_type
    return message_factory.GetMessageClass(descriptor)


@pytest.mark.parametrize("doc", ["clients.md", "deploy.md"])
def test_grpcurl_request_bodies_in_the_docs_are_valid(doc):
    assert health_pb2.DESCRIPTOR.services_by_name["Health"], "grpc.health.v1 must be in the default pool"
    text = (REPO_ROOT / "docs" / doc).read_text()
    calls = GRPCURL_CALL.findall(text)
    assert calls or doc == "deploy.md"
    for body, service, method in calls:
        json_format.Parse(body, _request_class(service, method)())
