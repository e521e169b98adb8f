"""Rollout service: generates GRPO completions (token ids, logprobs, policy version) from a
policy served by an HF transformers or a vLLM engine, and takes new policy weights.

Layers: ``api`` (gRPC servicer and protobuf converters) → ``core`` (validation, the versioned
weights and sleep state machines, the batch scheduler) → ``engines`` (``hf``, ``vllm``).
``client.RolloutClient`` is the synchronous client the trainer uses.
"""
