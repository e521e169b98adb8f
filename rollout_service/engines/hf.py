"""HF transformers engine: a manual decode loop with a KV cache, so sampling and logprobs are
exactly under our control (see ``engines.sampling``). The cache is allocated once per batch and
written in place (``engines.hf_cache``).

Batching: all rows of all jobs handed to one ``generate`` call run together, ``max_batch_size``
rows per forward pass, prompts left-padded. Finished rows are dropped from the batch (and its
KV cache) once a quarter of it has finished, so long-tail rows do not pay for short ones.

Partial rollouts (a ``pause`` handed to ``generate``): every ``pause.segment_tokens`` steps the loop
checks whether a weight update waits; if so it drops the batch's KV cache, lets the update apply, and
prefills prompt + tokens generated so far again with the new weights before sampling on. Recomputing
costs one prefill per update per batch, and makes every later token exactly what the new weights sample
after that prefix: its logprob is the new policy's, the quantity the trainer's per-token importance
ratio divides by. PipelineRL keeps the stale KV cache instead (no extra prefill, but then a token's
logprob is neither policy's: the prefix's keys and values are the old weights'); one batched prefill per
update that actually arrives mid-batch is a small price for a ratio that means what it says.

Vision-language models (a checkpoint with a ``vision_config``) load with ``AutoModelForImageTextToText``
and their ``AutoProcessor``; a job's prompts then carry the processor's image inputs (``PromptImages.inputs``
of ``GenerationJob.images``), which the prefill receives concatenated in row order, the order of the batch's
image tokens. The image token is never sampled, and rows with images keep no episode cache (their
prefill needs the pixels).

Weights: a LoRA adapter is merged into the live weights, W = W0 + s·B·A, keeping a copy of W0
for the modules it touches so the next adapter (or a state dict) starts from the base again.

Sleep on CUDA: level 1 moves the model to host memory; level 2 frees it. On CPU the weights
already live in host memory, so level 1 only frees caches and level 2 frees the weights. Waking
from level 2 reloads the checkpoint from disk plus the base built by earlier state-dict updates
(saved to a temp file at sleep); the adapter is gone, and the service refuses to generate until
weights are pushed or loaded again (the contract every engine follows).
"""

from __future__ import annotations

import itertools
import math
import os
import random
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, PreTrainedModel

from grpo_runtime.image_tensors import concat_image_rows
from grpo_runtime.model_classes import auto_model_class, image_placeholder, load_processing
from grpo_runtime.tokenizing import decode_text
from rollout_service.engines.base import Engine, UpdatePause, derive_seed
from rollout_service.engines.hf_cache import decode_cache, seeded_layers
from rollout_service.engines.sampling import RowParams, sample_rows, sampling_logits, tempered_logprobs
from rollout_service.engines.session_caches import SessionCache, SessionCaches
from rollout_service.memory import release_freed_memory
from rollout_service.types import FinishReason, GenerationJob, RawCompletion, SamplingSpec
from rollout_service.weights import LoraAdapter, ValidatedUpdate

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Compact the batch (drop finished rows from the KV cache) when this share of rows is done.
COMPACT_FRACTION = 0.25


@dataclass
class _Row:
    """One sequence being sampled."""

    job: GenerationJob
    index: int  # in job.results
    prompt: list[int]
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # partial rollouts: the version of each token
    finish: FinishReason | None = None
    text: str | None = None
    prefilled: int = 0  # generated tokens that the current decode's prefill included (after a pause)
    images: dict[str, torch.Tensor] = field(default_factory=dict)  # the prompt's image inputs (none: text)


def _keeps_kv(row: _Row) -> bool:
    """Whether a finished row's KV is kept for its session's next call: one that sampled, without images
    (whose prefill needs the pixels)."""
    return (
        row.job.session is not None
        and row.finish not in (None, FinishReason.ABORT)
        and bool(row.tokens)
        and not row.images
    )


class HFEngine(Engine):
    name = "hf"

    def __init__(
        self,
        model_dir: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 256,
        max_model_len: int | None = None,
        seed: int = 0,
        session_cache_bytes: int = 2 << 30,
    ) -> None:
        self.model_dir = str(model_dir)
        self.device = device
        self._dtype = DTYPES[dtype]
        self.max_batch_size = max_batch_size
        config = AutoConfig.from_pretrained(self.model_dir)
        self._model_class = auto_model_class(config)
        self.tokenizer, self.processor = load_processing(self.model_dir)
        self._model: PreTrainedModel | None = self._load()
        self._text_config = self.model.config.get_text_config()
        self.max_model_len = int(max_model_len or self._text_config.max_position_embeddings)
        self._eos_ids = self._eos_token_ids()
        # A vision-language model's image token marks where image features go: sampled, it would stand for a
        # picture that does not exist (and the trainer's forward would count one image more than it has).
        self._input_only_ids = [image_placeholder(self.processor)[1]] if self.processor is not None else []
        self._pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self._eos_ids[0]
        )
        self._base: dict[str, torch.Tensor] = {}  # W0 of parameters the active LoRA modified
        self._state_pushed = False  # a state dict changed the base since the checkpoint
        self._snapshot = Path(tempfile.gettempdir()) / f"rollout-hf-{os.getpid()}-{id(self)}.safetensors"
        self._seed_source = random.Random(seed)
        self._seed_lock = threading.Lock()
        # Episodes' and gateway sessions' KV caches between calls (GenerationJob.session), within
        # session_cache_bytes; and what prefill computed vs reused.
        self._sessions = SessionCaches(session_cache_bytes)
        self.prefill_tokens = 0
        self.reused_tokens = 0

    # ----------------------------------------------------------------- loading
    def _load(self) -> PreTrainedModel:
        model = self._model_class.from_pretrained(self.model_dir, dtype=self._dtype)
        return model.to(self.device).eval()  # type: ignore[arg-type]  # @wraps(Module.to) hides self

    def _eos_token_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    @property
    def model(self) -> PreTrainedModel:
        if self._model is None:
            raise RuntimeError("the HF engine's weights were released by a level-2 sleep")
        return self._model

    # --------------------------------------------------------------- generate
    def generate(self, jobs: list[GenerationJob], pause: UpdatePause | None = None) -> None:
        """Rows are made (with their generators) one batch at a time, and rows of a job whose
        caller went away are never made: a cancelled request stops costing work and memory at
        once, not after every batch it queued."""
        for job in jobs:
            job.results = [RawCompletion([], [], FinishReason.ABORT, "")] * job.num_rows
        pending = self._live_rows(jobs)
        while batch := list(itertools.islice(pending, self.max_batch_size)):
            live = batch
            while self._decode(live, pause):
                assert pause is not None
                pause.pause()
                live = [row for row in live if row.finish is None]
            for row in batch:
                row.job.results[row.index] = RawCompletion(
                    row.tokens,
                    row.logprobs,
                    row.finish or FinishReason.ABORT,
                    row.text,
                    row.versions if pause is not None else None,
                )

    def _live_rows(self, jobs: list[GenerationJob]) -> Iterator[_Row]:
        """Every sequence still wanted, prompt-major within each job, made on demand."""
        for job in jobs:
            for i, prompt in enumerate(job.prompt_token_ids):
                for j in range(job.n):
                    if job.cancel.cancelled:
                        break
                    generator = self._generator(job.sampling, i, j)
                    images = job.images[i] if job.images else None
                    yield _Row(job, i * job.n + j, prompt, generator, images=images.inputs if images else {})

    def _generator(self, sampling: SamplingSpec, prompt_index: int, sample_index: int) -> torch.Generator:
        if sampling.seed is None:
            with self._seed_lock:
                seed = self._seed_source.getrandbits(63)
        else:
            seed = derive_seed(sampling.seed, prompt_index, sample_index)
        return torch.Generator().manual_seed(seed)

    def _cached_prefix(self, row: _Row, context: list[int]) -> SessionCache | None:
        """The row's episode cache when it holds a proper prefix of ``context`` (else None). A row with images
        has none: its image tokens take their features from this prefill's pixel inputs."""
        if row.images:
            return None
        cached = self._sessions.get(row.job.session) if row.job.session is not None else None
        if cached is None or len(cached.tokens) >= len(context):
            return None
        return cached if context[: len(cached.tokens)] == cached.tokens else None

    @torch.inference_mode()
    def _decode(self, rows: list[_Row], pause: UpdatePause | None = None) -> bool:
        """Prefill, then sample token by token until every row finished (returns False) or, with ``pause``,
        until a weight update waits at a segment boundary (returns True; the caller lets it apply and calls
        again with the unfinished rows, whose prefill then covers prompt + tokens generated so far).

        Layout of the batch's positions: a region of width L = max cached length, where each row's cached KV
        (an episode's earlier turns) sits right-aligned, then a region of width S = max uncached length, where
        the rest of each prompt sits right-aligned; holes are masked out and position ids count only real
        tokens, so a row sees exactly its own sequence. Without cached rows L = 0: plain left padding.
        """
        model = self.model
        dev = self.device
        contexts = [r.prompt + r.tokens for r in rows]
        for row in rows:
            row.prefilled = len(row.tokens)
        capacity = max(len(r.prompt) + r.job.sampling.max_tokens for r in rows)
        cache = decode_cache(model.config, capacity)
        seedable = seeded_layers(cache)
        pairs = zip(rows, contexts, strict=True)
        cached = [self._cached_prefix(r, c) if seedable else None for r, c in pairs]
        lengths = [len(c.tokens) if c is not None else 0 for c in cached]
        reused = max(lengths)
        suffix = max(len(c) - n for c, n in zip(contexts, lengths, strict=True))
        width = reused + suffix
        input_ids = torch.full((len(rows), suffix), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for b, (context, n) in enumerate(zip(contexts, lengths, strict=True)):
            rest = context[n:]
            input_ids[b, suffix - len(rest) :] = torch.tensor(rest)
            attention[b, reused - n : reused] = 1
            attention[b, width - len(rest) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        if reused:
            self._seed(cache, cached, lengths, reused)
        self.prefill_tokens += int(attention[:, reused:].sum())
        self.reused_tokens += sum(lengths)
        params = _row_params([r.job.sampling for r in rows])
        vocab = self._text_config.vocab_size
        seen = None
        if params.any_penalty:
            seen = torch.zeros((len(rows), vocab), dtype=torch.bool)
            for b, context in enumerate(contexts):
                seen[b, torch.tensor(context)] = True
        out = model(
            input_ids=input_ids.to(dev),
            attention_mask=attention.to(dev),
            position_ids=positions[:, reused:].to(dev),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **self._image_inputs(rows),
        )
        active = list(range(len(rows)))  # batch row b ↔ rows[active[b]]; a cancelled row finishes
        # (ABORT) at its next step and leaves the batch with the next compaction
        step = rows[0].prefilled  # the rows of one decode have generated equally many tokens
        version = pause.version if pause is not None else None
        while True:
            logits = out.logits[:, -1, :].float().cpu()
            z = sampling_logits(logits, params, seen, step, self._eos_ids)
            if self._input_only_ids:
                z[:, self._input_only_ids] = float("-inf")
            generators = [rows[i].generator for i in active]
            tokens = sample_rows(z, params, generators)
            logprobs = tempered_logprobs(logits, params.temperature).gather(-1, tokens[:, None])[:, 0]
            step += 1
            for b, i in enumerate(active):
                self._append(rows[i], int(tokens[b]), float(logprobs[b]), version)
            if seen is not None:
                seen[torch.arange(len(active)), tokens] = True
            keep = [b for b, i in enumerate(active) if rows[i].finish is None]
            if not keep:
                self._keep_sessions(cache, attention, width, rows, active, range(len(active)))
                return False
            if pause is not None and step % pause.segment_tokens == 0 and pause.requested:
                # The update discards every session cache (old weights): none to keep from this batch.
                return True
            if len(keep) <= (1 - COMPACT_FRACTION) * len(active):
                leaving = [b for b in range(len(active)) if b not in set(keep)]
                self._keep_sessions(cache, attention, width, rows, active, leaving)
                index = torch.tensor(keep)
                cache.batch_select_indices(index.to(dev))
                attention, positions, tokens = attention[index], positions[index], tokens[index]
                params = _select(params, index)
                seen = seen[index] if seen is not None else None
                active = [active[b] for b in keep]
            attention = torch.cat([attention, torch.ones((len(active), 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(
                input_ids=tokens[:, None].to(dev),
                attention_mask=attention.to(dev),
                position_ids=positions.to(dev),
                past_key_values=cache,
                use_cache=True,
            )

    def _image_inputs(self, rows: list[_Row]) -> dict[str, torch.Tensor]:
        """The batch's image inputs: each key's tensors of the rows with images, concatenated in row order
        (the order of their image tokens in the batch, where the model scatters the image features;
        ``concat_image_rows``), floating ones in the model's dtype."""
        with_images = [r.images for r in rows if r.images]
        if not with_images:
            return {}
        out = {}
        for key in with_images[0]:
            tensor = concat_image_rows([images[key] for images in with_images])
            out[key] = tensor.to(self.device, self._dtype if tensor.is_floating_point() else tensor.dtype)
        return out

    def _seed(self, cache, cached: list[SessionCache | None], lengths: list[int], reused: int) -> None:
        """Fill the cache's first ``reused`` positions with each row's cached KV, right-aligned, zeros
        elsewhere (masked: zeros rather than empty memory keep stray NaNs out of the masked sum)."""
        for layer_index, layer in enumerate(cache.layers):
            like = next(c for c in cached if c is not None).keys[layer_index]
            heads, _, dim = like.shape
            keys = torch.zeros((len(cached), heads, reused, dim), dtype=like.dtype, device=like.device)
            values = torch.zeros_like(keys)
            for b, (c, n) in enumerate(zip(cached, lengths, strict=True)):
                if c is not None:
                    keys[b, :, reused - n :] = c.keys[layer_index]
                    values[b, :, reused - n :] = c.values[layer_index]
            layer.seed(keys, values)

    def _keep_sessions(
        self, cache, attention, width: int, rows: list[_Row], active: list[int], batch_rows
    ) -> None:
        """Store the KV of finished episode rows (batch indices ``batch_rows``) for their next turn: the
        prompt's positions and the generated tokens fed back (all but the last, which was never fed); one
        larger than the whole budget is not copied out."""
        if not seeded_layers(cache):
            return
        keeping = [b for b in batch_rows if _keeps_kv(rows[active[b]])]
        if not keeping:
            return
        # Keys and values of one position, all layers: (batch, kv_heads, capacity, head_dim) tensors.
        keys = [layer.keys for layer in cache.layers]
        token_bytes = sum(2 * k.shape[1] * k.shape[3] * k.element_size() for k in keys)
        for b in keeping:
            row = rows[active[b]]
            tokens = row.prompt + row.tokens[:-1]
            if not self._sessions.fits(len(tokens) * token_bytes):
                self._sessions.refuse(row.job.session)
                continue
            fed = len(row.tokens) - row.prefilled - 1
            real = torch.cat([attention[b, :width].nonzero()[:, 0], torch.arange(width, width + fed)])
            index = real.to(self.device)
            self._sessions.put(
                row.job.session,
                SessionCache(
                    tokens,
                    [layer.keys[b][:, index].clone() for layer in cache.layers],
                    [layer.values[b][:, index].clone() for layer in cache.layers],
                ),
            )

    def release_session(self, session: str) -> None:
        self._sessions.release(session)

    @property
    def session_caches(self) -> SessionCaches:
        """The kept caches: their bytes (``nbytes``), budget (``max_bytes``) and how many were dropped for
        room (``evicted``)."""
        return self._sessions

    def _append(self, row: _Row, token: int, logprob: float, version: int | None = None) -> None:
        if row.finish is not None:
            return
        if row.job.cancel.cancelled:
            row.finish = FinishReason.ABORT
            return
        row.tokens.append(token)
        row.logprobs.append(logprob)
        if version is not None:
            row.versions.append(version)
        if not math.isfinite(logprob):
            # Non-finite logits (weights that overflow): the row is garbage from here on, and the
            # core refuses to return it, so stop spending steps on it.
            row.finish = FinishReason.ABORT
            return
        sampling = row.job.sampling
        if token in self._eos_ids:
            row.finish = FinishReason.STOP
        if sampling.stop:
            text = decode_text(self.tokenizer, row.tokens, skip_special_tokens=True)
            cuts = [text.find(s) for s in sampling.stop if s in text]
            if cuts:
                row.text = text[: min(cuts)]
                row.finish = FinishReason.STOP
                return
        if row.finish is None and len(row.tokens) >= sampling.max_tokens:
            row.finish = FinishReason.LENGTH
        if row.finish is not None:
            row.text = decode_text(self.tokenizer, row.tokens, skip_special_tokens=True)

    # ---------------------------------------------------------------- weights
    @torch.no_grad()
    def apply_update(self, update: ValidatedUpdate) -> None:
        self._sessions.clear()  # computed by the old weights
        params = dict(self.model.named_parameters())
        if update.lora is not None:
            self._apply_lora(update.lora, params)
            return
        self._restore_base(params)
        state = self.model.state_dict()
        for name, tensor in (update.state_dict or {}).items():
            state[name].copy_(tensor)
        self._state_pushed = True

    def _apply_lora(self, lora: LoraAdapter, params: dict[str, torch.nn.Parameter]) -> None:
        targets = {f"{module}.weight": module for module in lora.modules}
        for name, base in self._base.items():
            if name not in targets:
                params[name].copy_(base)
        for name, module in targets.items():
            param = params[name]
            base = self._base.setdefault(name, param.detach().clone())
            lora.merge_into(module, base, param)

    def _restore_base(self, params: dict[str, torch.nn.Parameter]) -> None:
        """Undo the active adapter: a state dict is applied to the base weights."""
        for name, base in self._base.items():
            params[name].copy_(base)
        self._base = {}

    # ------------------------------------------------------------------ sleep
    def sleep(self, level: int) -> None:
        self._sessions.clear()
        if level == 1:
            if self.device != "cpu":
                self.model.to("cpu")  # type: ignore[arg-type]  # @wraps(Module.to) hides self
                self._base = {k: v.to("cpu") for k, v in self._base.items()}
        else:
            if self._state_pushed:
                # Level 2 forgets the adapter (the caller pushes it again) but not earlier
                # state-dict updates: the base they built is kept on disk for the wake-up.
                self._snapshot.parent.mkdir(parents=True, exist_ok=True)
                save_file(self._base_state(), self._snapshot)
            self._model = None
            self._base = {}
        release_freed_memory()

    def wake_up(self, tags: set[str]) -> None:
        if "weights" not in tags:
            return  # the KV cache is allocated per batch: nothing to restore
        if self._model is None:
            self._model = self._load()
            if self._snapshot.exists():
                self._model.load_state_dict(load_file(self._snapshot), strict=False)
                self._snapshot.unlink()
        elif self.device != "cpu":
            self._model.to(self.device)  # type: ignore[arg-type]  # @wraps(Module.to) hides self
            self._base = {k: v.to(self.device) for k, v in self._base.items()}

    def _base_state(self) -> dict[str, torch.Tensor]:
        """The live weights without the active adapter (W0 where an adapter changed W)."""
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.state_dict().items()}
        state.update({k: v.to("cpu").contiguous() for k, v in self._base.items()})
        if self._text_config.tie_word_embeddings:
            state.pop("lm_head.weight", None)  # shares storage with the embeddings
        return state

    def close(self) -> None:
        self._model = None
        self._snapshot.unlink(missing_ok=True)
        release_freed_memory()


def _row_params(specs: list[SamplingSpec]) -> RowParams:
    return RowParams(
        temperature=torch.tensor([s.temperature for s in specs], dtype=torch.float32),
        top_k=torch.tensor([s.top_k for s in specs], dtype=torch.long),
        top_p=torch.tensor([s.top_p for s in specs], dtype=torch.float32),
        min_p=torch.tensor([s.min_p for s in specs], dtype=torch.float32),
        repetition_penalty=torch.tensor([s.repetition_penalty for s in specs], dtype=torch.float32),
        min_tokens=torch.tensor([s.min_tokens for s in specs], dtype=torch.long),
    )


def _select(params: RowParams, index: torch.Tensor) -> RowParams:
    return RowParams(**{name: getattr(params, name)[index] for name in params.__dataclass_fields__})
