"""GRPO trainer service: trl.GRPOTrainer jobs that generate through the rollout service and score through the
reward service, run from the command line (``python -m trainer_service train``) or as a gRPC service."""

import warnings

# TRL warns at import that the installed vllm(-cpu) is newer than its tested range. The trainer never uses
# TRL's vLLM integration (generation goes through the rollout service), so the warning is noise here.
warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)
