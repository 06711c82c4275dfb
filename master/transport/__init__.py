"""The master's transport layer: the call pipeline every RPC goes through, the gRPC endpoint
and the stream channel that feed it, and token authentication."""
