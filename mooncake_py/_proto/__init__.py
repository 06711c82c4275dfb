"""Generated protobuf and gRPC code. Never edit by hand: run ``make proto``."""
