"""Tool environments for multi-turn episodes (``grpo.env.v1``): the episode registry and the shipped kinds."""
