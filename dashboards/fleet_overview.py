"""Fleet overview: how many hosts are healthy, suspect, drained or in repair; what is failing, where.

Reads the fleet services' own metrics (``fleethealth.metrics_names``), exported by ``fleethealth
run`` (port 9403) or by the detect/remediate workers.
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from dashboards.panels import dashboard, row, sel, stat, table, timeseries
from fleethealth import metrics_names as m

UID = "fleethealth-fleet-overview"
TITLE = "fleethealth / Fleet overview"

_RED = ((None, "green"), (1, "red"))
_AMBER = ((None, "green"), (1, "orange"))


def _hosts(state: str) -> str:
    matcher = f'state="{state}"'
    return f"sum({sel(m.HOSTS, matcher)})"


def build() -> Dashboard:
    in_service = sel(m.HOSTS, 'state=~"healthy|suspect"')
    availability = f"sum({in_service}) / sum({sel(m.HOSTS)})"
    opened = sel(m.INCIDENT_MESSAGES, 'state="open"')
    panels = [
        row("Fleet state"),
        stat("Healthy hosts", _hosts("healthy"), description="Hosts with no open incident."),
        stat("Suspect hosts", _hosts("suspect"), thresholds=_AMBER,
             description="Hosts with an open incident that are still in service."),
        stat("Drained hosts", _hosts("drained"), thresholds=_RED,
             description="Hosts drained by remediation (in dry-run: that would have been drained)."),
        stat("In repair", _hosts("in_repair"), thresholds=_AMBER,
             description="Hosts with an open repair ticket."),
        stat("Fleet availability", availability, unit="percentunit",
             thresholds=((None, "red"), (0.95, "orange"), (0.99, "green")),
             description="Share of hosts schedulable: healthy or suspect, not drained or in repair."),
        stat("Open tickets", f"sum({sel(m.TICKETS_OPEN)})", thresholds=_AMBER),
        row("Incidents"),
        timeseries("Open incidents by failure mode", (f"sum by (failure_mode) ({sel(m.INCIDENTS_OPEN)})",
                                                      "{{failure_mode}}"), stacked=True),
        timeseries("New incidents by failure mode",
                   (f"sum by (failure_mode) (increase({opened}[$__rate_interval]))",
                    "{{failure_mode}}"), bars=True,
                   description="Incident episodes opened per interval."),
        table("Top offending hosts",
              (f"topk(10, sum by (host, rack) ({sel(m.INCIDENTS_OPEN)}))", "")),
        table("Top offending racks", (f"topk(10, sum by (rack) ({sel(m.INCIDENTS_OPEN)}))", "")),
        row("Remediation"),
        timeseries("Host states", (f"sum by (state) ({sel(m.HOSTS)})", "{{state}}"), stacked=True, width=8),
        timeseries("Drained and queued nodes", (f"sum({sel(m.NODES_DRAINED)})", "drained"),
                   (f"sum({sel(m.NODES_QUEUED)})", "queued"), width=8),
        timeseries("Open tickets by age", (f"sum by (age_bucket) ({sel(m.TICKETS_OPEN)})", "{{age_bucket}}"), stacked=True,
                   width=8),
        timeseries("Remediation actions", (f"sum by (kind, outcome) (increase({sel(m.ACTIONS)}[$__rate_interval]))",
                                           "{{kind}} / {{outcome}}"), bars=True),
        timeseries("Guard refusals", (f"sum by (guard) ({sel(m.GUARD_REFUSALS)})", "{{guard}}"),
                   description="Drains a safety guard refused (cluster fraction, per-host rate limit)."),
    ]
    return dashboard(UID, TITLE, "Fleet health at a glance: host states, incidents, remediation.", panels,
                     tags=["fleet"])
