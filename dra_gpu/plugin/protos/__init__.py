"""Generated gRPC stubs for the kubelet plugin protocols; regenerate with `make protos`, never edit by hand."""
