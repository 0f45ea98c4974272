"""The Kafka detect worker: consume telemetry, run the engine, publish incidents, commit."""
