"""Generation through the rollout service: TRL's ``rollout_func``, async prefetch, weight sync, replicas and
CPU placement."""
