"""Scoring a run against its ground truth, and the scorecard report."""
