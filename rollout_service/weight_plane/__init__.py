"""The weight data plane: how a policy's tensors travel from the trainer to a rollout replica.

The rollout service owns this contract; the trainer sends through it (by way of
:mod:`rollout_service.client`), the replica receives through it (:mod:`rollout_service.core.weight_channel`
holds the replica's channel state). gRPC stays the control plane: ``UpdateWeights`` streams the bytes
themselves, ``UpdateWeightsFromChannel`` carries the version, the format and a manifest of bytes that
arrive outside gRPC. The protobuf side of each message is the service's codec
(:mod:`rollout_service.weight_codec`).

- :mod:`.payload`: one safetensors file as bytes, encoded from and parsed into tensors without a copy,
  received chunk by chunk (the ``UpdateWeights`` stream);
- :mod:`.manifest`: what ``UpdateWeightsFromChannel`` says about the bytes (tensor layouts in buckets)
  and the checks a replica runs on it before any byte arrives;
- :mod:`.buckets`: packing tensors into buckets, flat byte buffers of a few hundred MB, and reading them
  back as views;
- :mod:`.shared_memory`: buckets as files of a memory-backed directory both processes see;
- :mod:`.distributed`: buckets broadcast over a torch.distributed group of their own.

Every module here imports torch; none imports the rollout service's core, engines or servicer.
"""
