"""Training-run configuration: the run YAML, the loss-variant catalog and rollout targets.

Plain pydantic and Python, importable without torch, TRL or transformers, so a config can be validated (by the
CLI, the service's StartRun, a deploy test) before anything heavy is loaded.
"""
