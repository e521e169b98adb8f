"""Tiny randomly initialised Qwen2 models for tests and benchmarks.

``python -m tiny_models --out DIR`` writes, each with the shared tokenizer:

- ``policy``: ``Qwen2ForCausalLM``, hidden 128, 2 heads of head_dim 64 (vLLM's CPU attention
  rejects head_dim 16), 2 layers, about 0.4M parameters;
- ``policy-large``: the same shape at hidden 512, 8 layers (about 23M parameters), for
  benchmarks where per-step overheads must be measured against real compute;
- ``prm-token``: ``Qwen2ForTokenClassification`` with 2 labels (Qwen2.5-Math-PRM format);
- ``prm-steptag``: ``Qwen2ForCausalLM`` read at the ``ки`` step tag (Math-Shepherd format);
- ``orm``: ``Qwen2ForSequenceClassification`` with 1 label (TRL's reward-model format);
- ``judge``: ``Qwen2ForCausalLM`` trained to a checked criterion to answer a judge's yes/no question
  (``tiny_models/judge.py``), with the shared tokenizer plus the words ``Yes`` and ``No``.

Weights are seeded, so two runs on one machine write identical models; a trained model's weights differ
between CPUs, but each meets its criterion or the build fails. Each model directory holds
``tiny_model.json``: its kind, a digest of this package's sources (a model built by other sources is
built again) and, for a trained model, the figures of its criterion.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TypedDict

import torch
from transformers import (
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen2ForTokenClassification,
)

from tiny_models.judge import judge_tokenizer, train_judge
from tiny_models.tokenizer import build_tokenizer

STAMP = "tiny_model.json"
SOURCES = Path(__file__).parent


class Shape(TypedDict):
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int


SHAPES: dict[str, Shape] = {
    "small": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2},
    "large": {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8},
}


def decoder_dims(tokenizer: PreTrainedTokenizerBase, shape: str = "small") -> dict:
    """A decoder config's keys for ``shape`` (``SHAPES``) with head_dim 64 and the tokenizer's vocabulary and
    special ids; the same keys in Qwen2's and Llama's configs."""
    dims = SHAPES[shape]
    heads = dims["hidden_size"] // 64
    return {
        "vocab_size": len(tokenizer),
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": 64,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": None,
        **dims,
    }


def qwen2_config(tokenizer: PreTrainedTokenizerBase, shape: str = "small", **extra) -> Qwen2Config:
    """Qwen2 config with head_dim 64 and the tokenizer's vocabulary and special ids."""
    # transformers types a config's __init__ with its dataclass fields only; the rest (head_dim, torch_dtype)
    # it takes as extra keys at run time.
    return Qwen2Config(**decoder_dims(tokenizer, shape), torch_dtype="float32", **extra)  # type: ignore[call-arg]


def _save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out: Path) -> Path:
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


def served_tokenizer(
    tokenizer: PreTrainedTokenizerBase, config: Qwen2Config, out: Path
) -> PreTrainedTokenizerBase:
    """``tokenizer`` as every consumer (TRL, vLLM, the services) loads it from the model directory ``out``,
    where it is saved beside ``config``: next to a Qwen2 config.json, AutoTokenizer resolves it to
    Qwen2Tokenizer, whose pre-tokenizer splits every digit on its own, unlike the in-memory tokenizer.
    A model trained here must be trained on these ids."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    config.save_pretrained(out)
    return AutoTokenizer.from_pretrained(out)


def sources_digest() -> str:
    """sha256 of this package's Python sources: the builder that made a model."""
    digest = hashlib.sha256()
    for path in sorted(SOURCES.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def make_model(kind: str, out: Path, seed: int = 0) -> Path:
    """Create one tiny model (``kind`` as in the module docstring) in ``out``; raises when a trained
    model misses its criterion (nothing is written then)."""
    tokenizer = build_tokenizer()
    figures: dict = {}
    model: PreTrainedModel
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
        config = qwen2_config(tokenizer)
        model, report = train_judge(Qwen2ForCausalLM(config), served_tokenizer(tokenizer, config, out), seed)
        figures = dataclasses.asdict(report)
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}")
    _save(model.eval(), tokenizer, out)
    stamp = {"kind": kind, "sources": sources_digest(), "criterion": figures}
    (out / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    (out / STAMP).chmod(0o644)
    return out


def is_current(path: Path, kind: str) -> bool:
    """Whether ``path`` holds a ``kind`` model built by these sources."""
    try:
        stamp = json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("kind") == kind and stamp.get("sources") == sources_digest()


KINDS = ("policy", "policy-large", "prm-token", "prm-steptag", "orm", "judge")


def make_all(root: Path, kinds: tuple[str, ...] = KINDS) -> dict[str, Path]:
    """Create every model under ``root`` that is missing or built by other sources; returns kind →
    directory."""
    paths = {}
    for kind in kinds:
        path = root / kind
        if not is_current(path, kind):
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
