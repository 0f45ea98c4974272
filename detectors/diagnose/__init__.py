"""``fleethealth diagnose``: the offline doctor for captured artifacts."""
