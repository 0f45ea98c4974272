"""Names of the fleet services' own Prometheus metrics, in one place.

Dashboards query these names; ``fleetcli.fleet_metrics`` exports the ones the pipeline layer
derives from the bus (host states, open incidents, lag, last sample age); the remediation worker
exports its own (actions, drained / queued nodes, tickets by age, guard refusals). The
collector's per-host metrics are named in ``collectors/metrics.tsv`` (the exporter's catalogue).
"""

from __future__ import annotations

# ---- fleet state (derived from incidents + actions + tickets by fleetcli.fleet_metrics)
HOSTS = "fleethealth_fleet_hosts"  # gauge {state=healthy|suspect|drained|in_repair}
INCIDENTS_OPEN = "fleethealth_fleet_incidents_open"  # gauge {host, rack, failure_mode, severity}
INCIDENT_MESSAGES = "fleethealth_fleet_incident_messages_total"  # counter {failure_mode, state}

# ---- remediation worker (remediation/metrics.py: RemediationMetrics; port 9402, or 9403 under `run`)
ACTIONS = "fleethealth_remediation_actions_total"  # counter {kind, outcome}
NODES_DRAINED = "fleethealth_remediation_drained_nodes"  # gauge
NODES_QUEUED = "fleethealth_remediation_queued_actions"  # gauge
GUARD_REFUSALS = "fleethealth_guard_refusals_total"  # counter {guard}
TICKETS_OPEN = "fleethealth_tickets_open"  # gauge {age_bucket}
COMMON_CAUSE_OPEN = "fleethealth_remediation_common_cause_open"  # gauge {kind}: remediation/common_cause.py
COMMON_CAUSE_HELD = "fleethealth_remediation_common_cause_held"  # gauge: incidents held behind one
REMEDIATION_BUS_ERRORS = "fleethealth_remediation_bus_errors_total"  # counter {op}: poll|publish|flush|commit

# ---- pipeline health
CONSUMER_LAG = "fleethealth_pipeline_consumer_lag_messages"  # gauge {group, topic}
MESSAGES = "fleethealth_pipeline_messages_total"  # counter {topic}
SAMPLES = "fleethealth_pipeline_samples_total"  # counter: telemetry samples consumed by detectors
DEAD_LETTERS = "fleethealth_pipeline_dead_letters_total"  # counter
LAST_SAMPLE_TS = "fleethealth_pipeline_host_last_sample_timestamp_seconds"  # gauge {host, rack}: sample ts
LAST_SAMPLE_AGE = "fleethealth_pipeline_host_last_sample_age_seconds"  # gauge {host, rack}: since receipt
STALE_HOSTS = "fleethealth_pipeline_stale_hosts"  # gauge: hosts silent longer than the threshold
COLLECTOR_SPOOL = "fleethealth_collector_spool_depth"  # gauge {host}: collectors/metrics.tsv

HOST_STATES = ("healthy", "suspect", "drained", "in_repair")
STALE_AFTER_S = 30.0
