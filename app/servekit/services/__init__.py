"""Services: what every protocol adapter calls (the DataPlane for health, metadata, inference,
configuration and statistics; ModelControl for load, unload, push and hot reload), plus the
statistics, metrics, batching and the serve.yaml watcher behind them. No transport framework is
imported here."""
