"""Prometheus metrics of the remediation worker, on a registry of its own (one per worker)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class RemediationMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.actions = Counter("fleethealth_remediation_actions", "Remediation decisions by kind and outcome",
                               ["kind", "outcome"], registry=r)
        self.drained = Gauge("fleethealth_remediation_drained_nodes", "Nodes fleethealth holds drained now",
                             registry=r)
        self.queued = Gauge("fleethealth_remediation_queued_actions", "Actions queued by a guard or a PDB",
                            registry=r)
        self.tickets_open = Gauge("fleethealth_tickets_open", "Open repair tickets by age", ["age_bucket"],
                                  registry=r)
        self.refusals = Counter("fleethealth_guard_refusals", "Actions a safety guard refused or queued",
                                ["guard"], registry=r)
        self.dead_letters = Counter("fleethealth_remediation_dead_letters",
                                    "Incident messages dead-lettered (malformed, unknown failure mode)", registry=r)
        self.incidents = Counter("fleethealth_remediation_incidents", "Incidents handled", ["state"], registry=r)
        self.bus_errors = Counter("fleethealth_remediation_bus_errors",
                                  "Bus calls that failed and were carried over (poll, publish, flush, commit)", ["op"],
                                  registry=r)
        self.common_cause = Gauge("fleethealth_remediation_common_cause_open",
                                  "Open common-cause incidents by kind of shared part (switch, pdu, rack, ...)",
                                  ["kind"], registry=r)
        self.held = Gauge("fleethealth_remediation_common_cause_held",
                          "Incidents held behind an open common-cause incident", registry=r)
        self.outbox = Gauge("fleethealth_tickets_outbox_pending", "Ticket events waiting for the webhook",
                            registry=r)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
