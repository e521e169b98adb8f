"""gRPC layer: the thin servicer (its conversions are the service's codec, shared with the client)."""
