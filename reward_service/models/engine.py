"""The small interface every reward-model engine implements (PRM formats, ORM).

A request flows ``encode`` (per sample, tokenizer only) → dynamic batcher → ``forward`` (one padded
batch, worker thread) → ``finish`` (per sample, params applied). ``forward`` returns only the few
numbers each sequence needs (step probabilities, one logit), so no big tensor crosses threads.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, LinearAttentionCacheLayerMixin

from grpo_runtime.errors import InvalidArgument
from reward_service.core.types import ComponentResult, Message, ParamInfo, RewardDescription, Sample
from reward_service.models.loading import LoadedModel
from reward_service.models.planning import plan_batches
from reward_service.models.prefix import share_prefixes
from reward_service.models.sequences import Encoded, Prefix

log = logging.getLogger(__name__)

__all__ = ["Encoded", "Prefix", "RewardModelEngine", "SampleError", "chat_messages"]


class SampleError(Exception):
    """A sample this model cannot score; becomes that sample's ``ComponentResult.error``."""


def chat_messages(messages: tuple[Message, ...] | list[Message]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def right_padded(sequences: list[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T) int64 with T the longest sequence: each row right-padded
    with ``pad_token_id`` and masked (0) after its own tokens."""
    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask


class RewardModelEngine(abc.ABC):
    """Scores samples with one loaded model.

    Two fast paths, each turned on by ``check_fast_paths`` only where it reproduces the plain
    forward: ``share_prefixes`` (compute a shared prefix once, reuse its KV cache) and
    ``fast_head`` (an engine-specific cheaper read-out of the same logits).
    """

    params: tuple[ParamInfo, ...] = ()

    def __init__(
        self, loaded: LoadedModel, *, max_batch_tokens: int = 4096, overhead_tokens: int = 64
    ) -> None:
        self.loaded = loaded
        self.max_batch_tokens = max_batch_tokens
        self.overhead_tokens = overhead_tokens  # cost of one more forward, in tokens (plan_batches)
        self.share_prefixes = False
        self.fast_head = False
        self.prefix_tokens_computed = 0  # prefix tokens run (padding included), for benchmarks
        # Fast tokenizers are not safe to call from several threads at once.
        self._tokenizer_lock = threading.Lock()

    @abc.abstractmethod
    def _encode(self, sample: Sample) -> Encoded:
        """Token ids (and readout positions) of one sample; raises SampleError."""

    @abc.abstractmethod
    def _readout(self, logits: torch.Tensor, batch: list[Encoded]) -> list[Any]:
        """Per-sequence results from the padded batch's logits (model dtype; upcast what is read).

        Row ``r`` of ``logits`` holds sequence ``batch[r]`` from its token ``batch[r].prefix_tokens``
        on: a read-out position ``t`` of the sequence is row position ``t - prefix_tokens``.
        """

    @abc.abstractmethod
    def finish(self, output: Any, params: dict[str, Any]) -> ComponentResult:
        """The component result of one sample from its ``forward`` output."""

    @abc.abstractmethod
    def describe(self, reward_name: str) -> RewardDescription: ...

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with defaults filled in; InvalidArgument naming ``params.<key>``."""
        known = {p.name: p for p in self.params}
        for key in params:
            if key not in known:
                raise InvalidArgument(
                    f"unknown parameter; accepted: {', '.join(known) or 'none'}", field=f"params.{key}"
                )
        return {name: params.get(name, p.default) for name, p in known.items()}

    def encode(self, sample: Sample) -> Encoded:
        """Tokenize one sample; SampleError when it is empty or longer than the model accepts."""
        with self._tokenizer_lock:
            encoded = self._encode(sample)
        limit = self.loaded.max_positions
        if encoded.num_tokens > limit:
            raise SampleError(
                f"the input is {encoded.num_tokens} tokens, over the model's {limit} positions "
                "(max_position_embeddings); scoring it would need truncation"
            )
        return encoded

    def encode_samples(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[Encoded | str]:
        """Each sample's sequence, or why it has none (``params`` resolved; engines that encode a sample
        together with others, like a group judge, override this)."""
        encoded: list[Encoded | str] = []
        for sample in samples:
            try:
                encoded.append(self.encode(sample))
            except SampleError as exc:
                encoded.append(str(exc))
        return encoded

    def forward(self, batch: list[Encoded]) -> list[Any]:
        """One right-padded forward over ``batch``; worker thread.

        Without shared prefixes: B sequences padded to the longest, T = max num_tokens. Right
        padding keeps every real token at its unpadded position, so a sequence scores the same
        alone or in any batch (TRL pads reward-model inputs on the right too).

        With shared prefixes: each distinct prefix not yet computed runs once (``_compute_prefixes``)
        and the batch runs only the suffixes, T = max suffix_tokens, attending to its prefix's KV
        cache at positions ``P_r + t`` (``_suffix_inputs``).
        """
        with torch.inference_mode():
            if not any(item.prefix is not None for item in batch):
                return self._run(self._plain_inputs(batch), batch)
            self._compute_prefixes(batch)
            return self._run(self._suffix_inputs(batch), batch)

    def release_accelerator_memory(self) -> None:
        """Hand the caching allocator's free blocks back to the driver once the engine's last owner has let
        it go (a replaced or unloaded model on CUDA)."""
        torch.cuda.empty_cache()

    def _run(self, inputs: dict[str, Any], batch: list[Encoded]) -> list[Any]:
        """The model on ``inputs`` (already on the device), read out per sequence."""
        out = self.loaded.model(**inputs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        return self._readout(logits, batch)

    def _backbone(self) -> torch.nn.Module:
        """The decoder without its head (``Qwen2Model`` inside ``Qwen2ForTokenClassification``)."""
        model = self.loaded.model
        return getattr(model, model.base_model_prefix)

    def _plain_inputs(self, batch: list[Encoded]) -> dict[str, Any]:
        input_ids, attention_mask = right_padded([e.input_ids for e in batch], self.loaded.pad_token_id)
        device = self.loaded.device
        # use_cache=False: nothing is generated after this forward, so no KV cache is built.
        return {
            "input_ids": input_ids.to(device),
            "attention_mask": attention_mask.to(device),
            "use_cache": False,
        }

    def _compute_prefixes(self, batch: list[Encoded]) -> None:
        """Run the batch's prefixes that have no KV yet, right-padded, cut like a flush
        (``plan_batches``); store each one's own (unpadded) keys and values on it."""
        missing = {id(e.prefix): e.prefix for e in batch if e.prefix is not None and e.prefix.kv is None}
        todo = sorted(missing.values(), key=lambda prefix: prefix.num_tokens)
        sizes = plan_batches(
            [prefix.num_tokens for prefix in todo], self.max_batch_tokens, self.overhead_tokens
        )
        start = 0
        for size in sizes:
            chunk = todo[start : start + size]
            start += size
            input_ids, attention_mask = right_padded([p.input_ids for p in chunk], self.loaded.pad_token_id)
            width = input_ids.shape[1]
            device = self.loaded.device
            out = self._backbone()(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=True
            )
            layers = out.past_key_values.layers
            if any(type(layer) is not DynamicLayer for layer in layers):
                # Sliding-window layers drop old keys: a prefix KV cache would not be exact.
                raise RuntimeError(f"prefix sharing needs full-attention cache layers, got {type(layers[0])}")
            for row, prefix in enumerate(chunk):
                n = prefix.num_tokens
                prefix.kv = torch.stack(
                    [torch.stack([layer.keys[row, :, :n], layer.values[row, :, :n]]) for layer in layers]
                )
            self.prefix_tokens_computed += len(chunk) * width

    def _suffix_inputs(self, batch: list[Encoded]) -> dict[str, Any]:
        """Suffixes right-padded to S = max suffix_tokens, after a KV cache of P = max prefix_tokens.

        Row r's cache holds its prefix's keys in slots [0, P_r) and zeros (masked) in [P_r, P); its
        suffix sits in slots [P, P + S_r) at positions P_r + t, so each real token sees exactly the
        tokens before it in the unsplit sequence. Sequences without a prefix have P_r = 0.
        """
        pad = self.loaded.pad_token_id
        device = self.loaded.device
        rows, width = len(batch), max(e.suffix_tokens for e in batch)
        past = max(e.prefix_tokens for e in batch)
        input_ids = torch.full((rows, width), pad, dtype=torch.long)
        attention_mask = torch.zeros((rows, past + width), dtype=torch.long)
        position_ids = torch.zeros((rows, width), dtype=torch.long)
        steps = torch.arange(width)
        for row, e in enumerate(batch):
            p, s = e.prefix_tokens, e.suffix_tokens
            input_ids[row, :s] = torch.tensor(e.input_ids[p:], dtype=torch.long)
            attention_mask[row, :p] = 1
            attention_mask[row, past : past + s] = 1
            # Padding positions are clamped to the last real one: masked, but kept in RoPE's range.
            position_ids[row] = p + steps.clamp(max=s - 1)
        rows_of: dict[int, list[int]] = {}  # id(prefix) -> rows of the batch that share it
        for row, e in enumerate(batch):
            rows_of.setdefault(id(e.prefix), []).append(row)
        owners = {id(e.prefix): e.prefix for e in batch}
        groups = [(owners[key], torch.tensor(members, device=device)) for key, members in rows_of.items()]
        kv = next(prefix.computed_kv for prefix, _ in groups if prefix is not None)  # (L, 2, heads, P_r, dim)
        # One buffer for every layer's keys and values: per distinct prefix one broadcast write of
        # its KV and zeros in the slots up to P (masked, but uninitialised memory could hold a NaN,
        # which survives a zero attention weight); the forward writes slots [P, P + S) itself.
        cache = kv.new_empty((kv.shape[0], 2, rows, kv.shape[2], past + width, kv.shape[4]))
        for prefix, index in groups:
            start = prefix.num_tokens if prefix is not None else 0
            if prefix is not None and start:
                cache[:, :, index, :, :start] = prefix.computed_kv.unsqueeze(2)
            if start < past:
                cache[:, :, index, :, start:past] = 0
        layers: list[CacheLayerMixin | LinearAttentionCacheLayerMixin] = [
            _PrefilledLayer(cache[layer, 0], cache[layer, 1], past) for layer in range(kv.shape[0])
        ]
        return {
            "input_ids": input_ids.to(device),
            "attention_mask": attention_mask.to(device),
            "position_ids": position_ids.to(device),
            "past_key_values": Cache(layers=layers),
            "use_cache": False,
        }

    def check_fast_paths(self, probe: list[Sample], tolerance: float) -> dict[str, bool]:
        """Turn on the fast paths that give this model's plain-forward results, and say which.

        Scores ``probe`` one sequence per forward with the plain path (the reference), then in one
        batch with each fast path in turn; a path whose outputs differ from the reference by more
        than ``tolerance x max(1, |reference|)``, or that raises, stays off. Blocking; run at load.
        """
        self._set_share_prefixes(False)
        self._set_fast_head(False)
        try:
            encoded = [self.encode(sample) for sample in probe]
            reference = [self.forward([item])[0] for item in encoded]
        except Exception as exc:  # e.g. a max_sequence_tokens below the probe's length, no chat template
            # Loading still succeeds: scoring reports such problems per sample, as it always did.
            log.warning("%s: fast paths off, the probe cannot be scored: %r", self.loaded.spec.path, exc)
            return {"fast_head": False, "share_prefixes": False}
        grouped = share_prefixes(encoded, 1)
        if not any(item.prefix is not None for item in grouped):
            raise ValueError("the probe's sequences share no prefix: it cannot check prefix sharing")
        enabled = {}
        for name, switch, batch in (
            ("fast_head", self._set_fast_head, encoded),
            ("share_prefixes", self._set_share_prefixes, grouped),
        ):
            if not switch(True):
                enabled[name] = False
                continue
            try:
                ok = _close(self.forward(batch), reference, tolerance)
                if not ok:
                    log.warning("%s: %s off, not the plain forward's results", self.loaded.spec.path, name)
            except Exception as exc:  # whatever the architecture lacks (no KV cache, other layers)
                log.warning("%s: %s off, it fails with this model: %r", self.loaded.spec.path, name, exc)
                ok = False
            switch(ok)
            enabled[name] = ok
        for item in grouped:  # the probe's prefix KV is not kept, nor counted
            if item.prefix is not None:
                item.prefix.kv = None
        self.prefix_tokens_computed = 0
        return enabled

    def _set_share_prefixes(self, on: bool) -> bool:
        self.share_prefixes = on
        return True

    def _set_fast_head(self, on: bool) -> bool:
        """Engines with a cheaper exact read-out override this; False: there is none."""
        return False


class _PrefilledLayer(DynamicLayer):
    """A cache layer over a buffer (B, heads, P + S, head_dim) that already holds the prefixes.

    The forward's ``update`` writes the suffix's keys and values into slots [P, P + S) in place,
    where ``DynamicLayer`` would concatenate: a copy of the whole cache per layer saved.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, past: int) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self._buffers = (keys, values)
        self._past = past
        self.keys, self.values = keys[:, :, :past], values[:, :, :past]
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._buffers
        end = self._past + key_states.shape[-2]
        keys[:, :, self._past : end] = key_states
        values[:, :, self._past : end] = value_states
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        return self.keys, self.values


def _close(got: list[Any], want: list[Any], tolerance: float) -> bool:
    """Outputs (floats or lists of floats) equal within ``tolerance x max(1, |want|)``."""

    def flat(values: list[Any]) -> list[float]:
        return [float(x) for v in values for x in (v if isinstance(v, list) else [v])]

    a, b = flat(got), flat(want)
    if len(a) != len(b):
        return False
    return all(abs(x - y) <= tolerance * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))
