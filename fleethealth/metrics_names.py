"""Names of the fleet services' own Prometheus metrics, in one place.

Dashboards query these names; ``fleethealth.fleet_metrics`` exports the ones the pipeline layer
derives from the bus (host states, open incidents, tickets by age, lag, last sample age). The
collector's per-host metrics are named in ``collectors/metrics.tsv`` (the exporter's catalogue).
"""

from __future__ import annotations

# ---- fleet state (derived from incidents + actions + tickets by fleethealth.fleet_metrics)
HOSTS = "fleethealth_fleet_hosts"  # gauge {state=healthy|suspect|drained|in_repair}
INCIDENTS_OPEN = "fleethealth_fleet_incidents_open"  # gauge {host, rack, failure_mode, severity}
INCIDENT_MESSAGES = "fleethealth_fleet_incident_messages_total"  # counter {failure_mode, state}
ACTIONS = "fleethealth_fleet_actions_total"  # counter {kind, outcome}
NODES_DRAINED = "fleethealth_fleet_nodes_drained"  # gauge {mode=live|dry_run}
NODES_QUEUED = "fleethealth_fleet_nodes_queued"  # gauge: drains waiting on a guard
GUARD_REFUSALS = "fleethealth_fleet_guard_refusals_total"  # counter {reason}
TICKETS_OPEN = "fleethealth_fleet_tickets_open"  # gauge {age=lt_1h|1h_1d|1d_7d|ge_7d}

# ---- pipeline health
CONSUMER_LAG = "fleethealth_pipeline_consumer_lag_messages"  # gauge {group, topic}
MESSAGES = "fleethealth_pipeline_messages_total"  # counter {topic}
SAMPLES = "fleethealth_pipeline_samples_total"  # counter: telemetry samples consumed by detectors
DEAD_LETTERS = "fleethealth_pipeline_dead_letters_total"  # counter
LAST_SAMPLE_TS = "fleethealth_pipeline_host_last_sample_timestamp_seconds"  # gauge {host, rack}: sample ts
LAST_SAMPLE_AGE = "fleethealth_pipeline_host_last_sample_age_seconds"  # gauge {host, rack}: since receipt
STALE_HOSTS = "fleethealth_pipeline_stale_hosts"  # gauge: hosts silent longer than the threshold
SPOOL_DEPTH = "fleethealth_pipeline_spool_messages"  # gauge: messages waiting in collector spools

HOST_STATES = ("healthy", "suspect", "drained", "in_repair")
TICKET_AGES = (("lt_1h", 3600.0), ("1h_1d", 86400.0), ("1d_7d", 7 * 86400.0), ("ge_7d", float("inf")))
STALE_AFTER_S = 30.0
