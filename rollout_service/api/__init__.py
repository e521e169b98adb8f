"""gRPC layer: protobuf ↔ domain conversion and the thin servicer."""
