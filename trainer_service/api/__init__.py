"""gRPC layer of the trainer service: the servicer (its conversions are the service's codec)."""
