"""fleethealth: hardware-reliability and fleet-health pipeline for GPU training clusters."""

__version__ = "0.1.0"
