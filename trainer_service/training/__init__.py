"""One GRPO training job on ``trl.GRPOTrainer``: builders, the loss variants, importance sampling, data,
callbacks."""
