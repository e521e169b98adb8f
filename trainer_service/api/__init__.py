"""gRPC layer of the trainer service: the servicer and protobuf ↔ domain converters."""
