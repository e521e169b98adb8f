"""What a push of a LoRA policy carries: PEFT's adapter state dict, the same on every push, with the embedding
layers exactly when PEFT's own default would include them, and without reading the base model's config from
disk after the first push."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from trainer_service.rollout.replica_push import ReplicaPush


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["q_proj", "embed_tokens"]])
def test_a_lora_push_carries_what_peft_saves_and_reads_the_base_config_once(
    tiny_models, monkeypatch, targets
):
    base = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    model = get_peft_model(base, LoraConfig(r=4, target_modules=targets))
    expected = get_peft_model_state_dict(model)  # PEFT's default, save_embedding_layers="auto"
    trainer = SimpleNamespace(accelerator=Accelerator(cpu=True), model=model, model_wrapped=None)
    push = ReplicaPush(versions=None, transports=None)

    first, config = push.payload(trainer)
    config_reads = []
    config_class = type(base.config)
    original = config_class.from_pretrained
    monkeypatch.setattr(
        config_class, "from_pretrained", lambda *a, **k: config_reads.append(a) or original(*a, **k)
    )
    second, _ = push.payload(trainer)

    assert first.keys() == second.keys() == expected.keys()
    assert any("embed_tokens" in key for key in expected) == ("embed_tokens" in targets)
    assert config["r"] == 4 and not config_reads
