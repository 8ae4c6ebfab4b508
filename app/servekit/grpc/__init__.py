"""gRPC adapter: servicers over the DataPlane."""
