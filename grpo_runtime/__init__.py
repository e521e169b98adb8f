"""Shared gRPC server runtime: health, reflection, auth, TLS, metrics, JSON logs, graceful shutdown."""
