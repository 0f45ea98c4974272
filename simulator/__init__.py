"""A seeded, reproducible GPU-fleet simulator producing contract telemetry with ground truth, and
the replay of recordings into the bus. See ``simulator/rates.py`` for the fault rates."""
