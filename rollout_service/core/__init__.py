"""Engine-independent logic of the rollout service (plain Python, testable without gRPC)."""
