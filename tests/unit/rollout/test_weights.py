"""Weight payload validation: all-or-nothing checks before anything touches an engine."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from grpo_runtime.errors import InvalidArgument, ResourceExhausted
from rollout_service.types import WeightFormat, WeightPayload
from rollout_service.weight_plane import payload as codec
from rollout_service.weights import (
    ParamCatalog,
    all_finite,
    read_directory,
    sha256_hex,
    state_dict_bytes,
    validate_payload,
)


@pytest.fixture(scope="module")
def catalog(tiny_models) -> ParamCatalog:
    return ParamCatalog.from_model_dir(tiny_models["policy"])


@pytest.fixture(scope="module")
def lora(tiny_models):
    """A PEFT adapter on the tiny policy with nonzero B (so it changes the weights)."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    model = get_peft_model(base, config)
    tensors = get_peft_model_state_dict(model)
    config_json = json.dumps(model.peft_config["default"].to_dict(), default=sorted)
    return model, tensors, config_json


def payload(data: bytes, fmt=WeightFormat.STATE_DICT, **kw) -> WeightPayload:
    return WeightPayload(version=1, format=fmt, data=data, sha256=kw.pop("sha256", sha256_hex(data)), **kw)


def field_of(call) -> str | None:
    with pytest.raises(InvalidArgument) as info:
        call()
    return info.value.field


def test_state_dict_checks(catalog):
    good = {"model.norm.weight": torch.ones(128)}
    data = state_dict_bytes(good)
    update = validate_payload(payload(data, total_bytes=len(data)), catalog)
    assert update.num_tensors == 1
    assert field_of(lambda: validate_payload(payload(data, sha256="0" * 64), catalog)) == "sha256"
    assert field_of(lambda: validate_payload(payload(data, sha256=""), catalog)) == "sha256"
    assert field_of(lambda: validate_payload(payload(data, total_bytes=5), catalog)) == "total_bytes"
    assert field_of(lambda: validate_payload(payload(b"not safetensors at all"), catalog)) == "data"
    assert field_of(lambda: validate_payload(payload(data[:-7]), catalog)) == "data"
    unknown = state_dict_bytes({"model.nope.weight": torch.ones(3)})
    assert field_of(lambda: validate_payload(payload(unknown), catalog)) == "data"
    shape = state_dict_bytes({"model.norm.weight": torch.ones(127)})
    assert field_of(lambda: validate_payload(payload(shape), catalog)) == "data"
    nan = state_dict_bytes({"model.norm.weight": torch.full((128,), float("nan"))})
    assert field_of(lambda: validate_payload(payload(nan), catalog)) == "data"
    unspecified = payload(data, fmt=WeightFormat.UNSPECIFIED)
    assert field_of(lambda: validate_payload(unspecified, catalog)) == "format"


def test_a_tied_parameter_is_kept_under_its_first_name_only(catalog):
    assert catalog.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    embed = torch.randn(513, 128)

    def validated(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return validate_payload(payload(state_dict_bytes(tensors)), catalog).state_dict

    both = validated({"model.embed_tokens.weight": embed, "lm_head.weight": embed.clone()})
    head_only = validated({"lm_head.weight": embed})
    for state in (both, head_only):
        assert list(state) == ["model.embed_tokens.weight"] and torch.equal(
            state["model.embed_tokens.weight"], embed
        )
    differing = {"model.embed_tokens.weight": embed, "lm_head.weight": embed + 1}
    with pytest.raises(InvalidArgument, match=re.escape("lm_head.weight")) as info:
        validated(differing)
    assert info.value.field == "data"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lora_merge_into_matches_peft_merge(catalog, lora, dtype):
    model, tensors, config_json = lora
    update = validate_payload(
        payload(state_dict_bytes(tensors), WeightFormat.LORA_ADAPTER, adapter_config_json=config_json),
        catalog,
    )
    assert update.lora is not None and len(update.lora.modules) == 6
    module = "model.layers.1.mlp.down_proj"
    peft_layer = model.base_model.model.model.layers[1].mlp.down_proj
    base = peft_layer.base_layer.weight.detach().to(dtype)
    expected = (base.float() + peft_layer.get_delta_weight("default")).to(dtype)
    out = torch.empty_like(base)
    update.lora.merge_into(module, base, out)
    assert out.dtype == dtype
    assert torch.allclose(out.float(), expected.float(), atol=1e-6 if dtype == torch.float32 else 1e-2)
    assert not torch.equal(out, base)


def test_lora_checks(catalog, lora):
    _, tensors, config_json = lora
    data = state_dict_bytes(tensors)

    def check(data=data, config=config_json):
        validate_payload(payload(data, WeightFormat.LORA_ADAPTER, adapter_config_json=config), catalog)

    assert field_of(lambda: check(config="")) == "adapter_config_json"
    assert field_of(lambda: check(config="{not json")) == "adapter_config_json"
    assert field_of(lambda: check(config=json.dumps({"r": 4}))) == "adapter_config_json"
    bad = dict(tensors)
    name = next(k for k in bad if k.endswith("lora_A.weight"))
    bad[name] = torch.ones(4, 3)
    assert field_of(lambda: check(data=state_dict_bytes(bad))) == "data"
    missing = {k: v for k, v in tensors.items() if k != name}
    assert field_of(lambda: check(data=state_dict_bytes(missing))) == "data"
    renamed = {k.replace("layers.0", "layers.9"): v for k, v in tensors.items()}
    assert field_of(lambda: check(data=state_dict_bytes(renamed))) == "data"


def test_read_directory(tmp_path, catalog, lora):
    model, _, _ = lora
    model.save_pretrained(tmp_path / "adapter")
    root = tmp_path.resolve()
    update = read_directory(str(tmp_path / "adapter"), 2, WeightFormat.UNSPECIFIED, catalog, root)
    assert update.format == WeightFormat.LORA_ADAPTER and update.lora is not None
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    (sd_dir / "part.safetensors").write_bytes(state_dict_bytes({"model.norm.weight": torch.ones(128)}))
    update = read_directory("sd", 3, WeightFormat.UNSPECIFIED, catalog, root)  # relative to the root
    assert update.format == WeightFormat.STATE_DICT and update.num_tensors == 1
    assert (
        field_of(lambda: read_directory(str(tmp_path / "nope"), 4, WeightFormat.UNSPECIFIED, catalog, root))
        == "path"
    )
    (tmp_path / "empty").mkdir()
    assert (
        field_of(lambda: read_directory(str(tmp_path / "empty"), 4, WeightFormat.STATE_DICT, catalog, root))
        == "path"
    )


def raw_safetensors(dtype: str, shape: list[int], nbytes: int, name: str = "model.norm.weight") -> bytes:
    """A safetensors file with one tensor of any dtype name (encode() only writes torch dtypes)."""
    header = json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + bytes(nbytes)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (raw_safetensors("F8_E4M3", [128], 128), "dtype F8_E4M3"),
        (raw_safetensors("F8_E5M2", [128], 128), "dtype F8_E5M2"),
        (raw_safetensors("F64", [128], 1024), "dtype F64"),
        (raw_safetensors("BOOL", [128], 128), "dtype BOOL"),
        (raw_safetensors("I32", [128], 512), "dtype I32"),
        (raw_safetensors("C64", [128], 1024), "unknown dtype"),
        (raw_safetensors("F32", [], 4), "shape []"),
        (raw_safetensors("F32", [0], 0), "shape [0]"),
    ],
)
def test_unsupported_dtypes_and_degenerate_tensors_are_refused(catalog, data, why):
    with pytest.raises(InvalidArgument, match=re.escape(why)) as info:
        validate_payload(payload(data), catalog)
    assert info.value.field == "data"


def test_lora_config_and_rank_checks(catalog, lora):
    _, tensors, config_json = lora
    data = state_dict_bytes(tensors)
    config = json.loads(config_json)

    def refused(data=data, **changes) -> str:
        text = changes.pop("text", None) or json.dumps({**config, **changes})
        with pytest.raises(InvalidArgument) as info:
            validate_payload(payload(data, WeightFormat.LORA_ADAPTER, adapter_config_json=text), catalog)
        return info.value.field

    assert refused(text=config_json.replace('"lora_alpha": 8', '"lora_alpha": NaN')) == "adapter_config_json"
    assert (
        refused(text=config_json.replace('"lora_alpha": 8', '"lora_alpha": 1e999')) == "adapter_config_json"
    )
    assert (
        refused(text=config_json.replace('"lora_alpha": 8', '"lora_alpha": Infinity'))
        == "adapter_config_json"
    )
    assert refused(lora_alpha="8") == "adapter_config_json"
    assert refused(lora_alpha=True) == "adapter_config_json"
    assert refused(r=0) == "adapter_config_json"
    assert refused(r=-4) == "adapter_config_json"
    assert refused(r=2) == "data"  # the tensors have rank 4
    assert refused(use_rslora="yes") == "adapter_config_json"
    assert refused(text="[" * 100_000 + "]" * 100_000) == "adapter_config_json"  # past the recursion limit
    assert refused(text=" " * (1 << 21) + "{}") == "adapter_config_json"
    assert refused(lora_alpha=1e300) == "data"  # s·B·A would overflow float32

    rank0 = {k: (v[:0] if "lora_A" in k else v[:, :0]) for k, v in tensors.items()}
    assert refused(data=raw_lora(rank0), r=None) == "data"
    a_name = next(k for k in tensors if k.endswith("lora_A.weight"))
    scalar = {**tensors, a_name: torch.tensor(1.0)}
    assert refused(data=state_dict_bytes(scalar)) == "data"


def raw_lora(tensors: dict[str, torch.Tensor]) -> bytes:
    """A LoRA payload whose tensors may be empty (encode writes them; the validation refuses)."""
    header, offset = {}, 0
    for name, tensor in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + bytes(offset)


def test_payload_receiver_caps_declared_and_streamed_sizes():
    with pytest.raises(ResourceExhausted, match="max_weight_bytes") as info:
        codec.PayloadReceiver(1000, max_bytes=999)
    assert info.value.field == "total_bytes"
    undeclared = codec.PayloadReceiver(0, max_bytes=10)
    undeclared.add(b"x" * 10)
    with pytest.raises(ResourceExhausted, match="max_weight_bytes"):
        undeclared.add(b"y")


def test_the_default_payload_cap_fits_two_float32_copies_of_the_model(catalog):
    numel = sum(math.prod(shape) for shape in catalog.shapes.values())
    assert catalog.max_payload_bytes == 8 * numel + (1 << 20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_all_finite_finds_one_bad_value_anywhere(dtype, bad):
    values = torch.randn(3 * (1 << 20) + 2).to(dtype)
    assert all_finite(values)
    for index in (0, 1 << 20, len(values) - 1):
        spoiled = values.clone()
        spoiled[index] = bad
        assert not all_finite(spoiled.reshape(-1, 7)), index
    assert all_finite(torch.tensor([torch.finfo(dtype).max, torch.finfo(dtype).min], dtype=dtype))
