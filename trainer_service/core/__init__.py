"""The trainer service's core: runs in worker processes, their events and the domain types (no gRPC)."""
