"""Tiny randomly initialised Qwen2 models for tests and benchmarks.

``python -m tiny_models --out DIR`` writes, each with the shared tokenizer:

- ``policy``: ``Qwen2ForCausalLM``, hidden 128, 2 heads of head_dim 64 (vLLM's CPU attention
  rejects head_dim 16), 2 layers, about 0.4M parameters;
- ``policy-large``: the same shape at hidden 512, 8 layers (about 23M parameters), for
  benchmarks where per-step overheads must be measured against real compute;
- ``prm-token``: ``Qwen2ForTokenClassification`` with 2 labels (Qwen2.5-Math-PRM format);
- ``prm-steptag``: ``Qwen2ForCausalLM`` read at the ``ки`` step tag (Math-Shepherd format);
- ``orm``: ``Qwen2ForSequenceClassification`` with 1 label (TRL's reward-model format);
- ``judge``: ``Qwen2ForCausalLM`` trained for a few seconds to answer a judge's yes/no question
  (``tiny_models/judge.py``), with the shared tokenizer plus the words ``Yes`` and ``No``.

Weights are seeded (the judge trains on one thread), so two runs write identical models.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen2ForTokenClassification,
)

from tiny_models.judge import judge_tokenizer, train_judge
from tiny_models.tokenizer import build_tokenizer

SHAPES = {
    "small": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2},
    "large": {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8},
}


def qwen2_config(tokenizer: PreTrainedTokenizerFast, shape: str = "small", **extra) -> Qwen2Config:
    """Qwen2 config with head_dim 64 and the tokenizer's vocabulary and special ids."""
    dims = SHAPES[shape]
    heads = dims["hidden_size"] // 64
    return Qwen2Config(
        vocab_size=len(tokenizer),
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
        **dims,
        **extra,
    )


def _save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if hasattr(model, "generation_config") and model.can_generate():
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.save_pretrained(out)
    # safetensors writes 0600 files; containers read the models as a non-root user.
    for path in out.iterdir():
        path.chmod(0o644)
    return out


def make_model(kind: str, out: Path, seed: int = 0) -> Path:
    """Create one tiny model (``kind`` as in the module docstring) in ``out``."""
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    if kind == "policy":
        model = Qwen2ForCausalLM(qwen2_config(tokenizer))
    elif kind == "policy-large":
        model = Qwen2ForCausalLM(qwen2_config(tokenizer, "large"))
    elif kind == "prm-token":
        model = Qwen2ForTokenClassification(qwen2_config(tokenizer, num_labels=2))
    elif kind == "prm-steptag":
        model = Qwen2ForCausalLM(qwen2_config(tokenizer))
    elif kind == "orm":
        model = Qwen2ForSequenceClassification(qwen2_config(tokenizer, num_labels=1))
    elif kind == "judge":
        tokenizer = judge_tokenizer()
        model = train_judge(Qwen2ForCausalLM(qwen2_config(tokenizer)), tokenizer, seed)
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}")
    return _save(model.eval(), tokenizer, out)


KINDS = ("policy", "policy-large", "prm-token", "prm-steptag", "orm", "judge")


def make_all(root: Path, kinds: tuple[str, ...] = KINDS) -> dict[str, Path]:
    """Create every model that is missing under ``root``; returns kind → directory."""
    paths = {}
    for kind in kinds:
        path = root / kind
        if not (path / "config.json").exists():
            make_model(kind, path)
        paths[kind] = path
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Create the tiny test models.")
    parser.add_argument("--out", type=Path, default=Path("tests/assets/models"))
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    args = parser.parse_args(argv)
    for kind, path in make_all(args.out, tuple(args.kinds)).items():
        print(f"{kind}: {path}")


if __name__ == "__main__":
    main()
