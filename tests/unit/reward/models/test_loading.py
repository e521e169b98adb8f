"""Loading: validation of device, dtype, path, kind/format and remote code; preload from settings."""

from __future__ import annotations

import shutil

import pytest
import torch
from pydantic import ValidationError

from grpo_runtime.errors import InvalidArgument
from reward_service.core.types import Sample
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings, PreloadModel
from reward_service.models.spec import ModelKind, ModelSpec, PrmFormat


@pytest.fixture
async def registry():
    registry = ModelRegistry(ModelSettings(allow_trust_remote_code=False))
    yield registry
    await registry.close()


async def _field_of_error(registry: ModelRegistry, spec: ModelSpec) -> str:
    with pytest.raises(InvalidArgument) as error:
        await registry.load(spec)
    assert registry.list() == []
    return error.value.field


async def test_cuda_without_cuda_names_device(registry, tiny_models):
    assert not torch.cuda.is_available()  # CI and this machine are CPU-only
    for device in ("cuda", "cuda:0", "tpu"):
        spec = ModelSpec(name="m", path=str(tiny_models["prm-token"]), kind=ModelKind.PRM, device=device)
        assert await _field_of_error(registry, spec) == "device"


async def test_unknown_dtype_names_dtype(registry, tiny_models):
    spec = ModelSpec(name="m", path=str(tiny_models["orm"]), kind=ModelKind.ORM, dtype="int4")
    assert await _field_of_error(registry, spec) == "dtype"


async def test_bad_paths_name_path(registry, tiny_models, tmp_path):
    (tmp_path / "empty").mkdir()
    broken = tmp_path / "no-weights"
    broken.mkdir()
    shutil.copy(tiny_models["orm"] / "config.json", broken / "config.json")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_models["orm"], corrupt)
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    for path in (str(tmp_path / "missing"), str(tmp_path / "empty"), str(broken), str(corrupt), ""):
        spec = ModelSpec(name="m", path=path, kind=ModelKind.ORM)
        assert await _field_of_error(registry, spec) == "path", path


async def test_wrong_architecture_names_kind_or_format(registry, tiny_models):
    cases = [
        (ModelSpec(name="m", path=str(tiny_models["prm-token"]), kind=ModelKind.ORM), "kind"),
        (ModelSpec(name="m", path=str(tiny_models["orm"]), kind=ModelKind.PRM), "kind"),
        (
            ModelSpec(
                name="m",
                path=str(tiny_models["prm-token"]),
                kind=ModelKind.PRM,
                prm_format=PrmFormat.STEP_TAG,
            ),
            "prm_format",
        ),
        (
            ModelSpec(
                name="m",
                path=str(tiny_models["prm-steptag"]),
                kind=ModelKind.PRM,
                prm_format=PrmFormat.TOKEN_CLASSIFICATION,
            ),
            "prm_format",
        ),
    ]
    for spec, field in cases:
        assert await _field_of_error(registry, spec) == field


async def test_remote_code_needs_server_permission(registry, tiny_models):
    spec = ModelSpec(name="m", path=str(tiny_models["orm"]), kind=ModelKind.ORM, trust_remote_code=True)
    assert await _field_of_error(registry, spec) == "trust_remote_code"
    allowed = ModelRegistry(ModelSettings(allow_trust_remote_code=True))
    try:
        info = await allowed.load(spec)
        assert info.kind is ModelKind.ORM
    finally:
        await allowed.close()


async def test_bad_names_and_tokens(registry, tiny_models):
    for name in ("Upper", "with space", "", "a/b"):
        spec = ModelSpec(name=name, path=str(tiny_models["orm"]), kind=ModelKind.ORM)
        assert await _field_of_error(registry, spec) == "name"
    path = str(tiny_models["prm-steptag"])
    spec = ModelSpec(name="m", path=path, kind=ModelKind.PRM, positive_token="-", negative_token="-")
    assert await _field_of_error(registry, spec) == "negative_token"


async def test_dtype_and_info(registry, tiny_models):
    spec = ModelSpec(name="half", path=str(tiny_models["prm-token"]), kind=ModelKind.PRM, dtype="bfloat16")
    info = await registry.load(spec)
    assert (info.name, info.kind, info.version, info.device, info.dtype) == (
        "half",
        ModelKind.PRM,
        1,
        "cpu",
        "bfloat16",
    )
    assert info.path == str(tiny_models["prm-token"]) and info.max_positions == 512
    assert info.loaded_at.tzinfo is not None
    # bfloat16 logits are upcast before the softmax; the scores stay probabilities.
    (result,) = await registry.score("prm:half", [Sample(id="1", completion="a\n\nb")], {})
    assert len(result.step_scores) == 2 and 0.0 <= result.value <= 1.0


async def test_preload_from_settings(tiny_models):
    settings = ModelSettings.model_validate(
        {
            "max_wait_ms": 1,
            "preload": [
                {"name": "steps", "path": str(tiny_models["prm-steptag"]), "kind": "prm"},
                {"name": "judge", "path": str(tiny_models["orm"]), "kind": "orm", "dtype": "float32"},
            ],
        }
    )
    registry = ModelRegistry(settings)
    await registry.start()
    try:
        assert [(i.name, i.kind, i.prm_format) for i in registry.list()] == [
            ("judge", ModelKind.ORM, None),
            ("steps", ModelKind.PRM, PrmFormat.STEP_TAG),
        ]
    finally:
        await registry.close()

    bad = ModelRegistry(
        ModelSettings(preload=[PreloadModel(name="x", path=str(tiny_models["orm"]), kind="prm")])
    )
    with pytest.raises(InvalidArgument) as error:
        await bad.start()
    assert error.value.field == "models.preload[0].kind"
    await bad.close()


def test_settings_reject_unknown_keys():
    with pytest.raises(ValidationError):
        ModelSettings.model_validate({"max_batch_token": 10})
    with pytest.raises(ValidationError):
        ModelSettings.model_validate({"preload": [{"name": "x", "path": "/p", "kind": "prm", "format": "a"}]})
