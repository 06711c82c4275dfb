"""The master's transport layer: protobuf handlers, the stream channel and authentication."""
