"""Pipeline health: is telemetry flowing, are consumers keeping up, is anything lost or stale."""

from __future__ import annotations

from grafanalib.core import Dashboard

from dashboards.panels import dashboard, row, sel, stat, table, timeseries
from fleethealth import metrics_names as m

UID = "fleethealth-pipeline-health"
TITLE = "fleethealth / Pipeline health"

_RATE = "[$__rate_interval]"


def build() -> Dashboard:
    panels = [
        row("Flow"),
        stat("Samples / s", f"sum(rate({sel(m.SAMPLES)}{_RATE}))", unit="short", width=5),
        stat("Consumer lag (max)", f"max({sel(m.CONSUMER_LAG)})", width=5,
             thresholds=((None, "green"), (1000, "orange"), (10000, "red"))),
        stat("Dead letters", f"sum({sel(m.DEAD_LETTERS)})", width=5, thresholds=((None, "green"), (1, "red"))),
        stat("Stale hosts", f"sum({sel(m.STALE_HOSTS)})", width=5, thresholds=((None, "green"), (1, "orange"))),
        stat("Spool depth", f"sum({sel(m.COLLECTOR_SPOOL)})", width=4, thresholds=((None, "green"), (1, "orange"))),
        timeseries("Throughput by topic", (f"sum by (topic) (rate({sel(m.MESSAGES)}{_RATE}))", "{{topic}}"),
                   unit="short"),
        timeseries("Consumer lag", (f"max by (group, topic) ({sel(m.CONSUMER_LAG)})", "{{group}} {{topic}}")),
        row("Loss and staleness"),
        timeseries("Dead-lettered messages", (f"sum(increase({sel(m.DEAD_LETTERS)}{_RATE}))", "dead letters"),
                   bars=True, width=8),
        timeseries("Spool depth by host", (f"topk(10, max by (host) ({sel(m.COLLECTOR_SPOOL)}))", "{{host}}"), width=8),
        timeseries("Scrape targets up", ('up{job=~"fleethealth.*", cluster=~"$cluster"}', "{{job}} {{instance}}"), width=8),
        table("Stalest hosts (last sample age)",
              (f"topk(15, max by (host, rack) ({sel(m.LAST_SAMPLE_AGE)}))", ""),
              description="Seconds since the last telemetry sample from each host arrived."),
        timeseries("Last sample age (p50 / max)",
                   (f"quantile(0.5, {sel(m.LAST_SAMPLE_AGE)})", "p50"), (f"max({sel(m.LAST_SAMPLE_AGE)})", "max"),
                   unit="s"),
    ]
    return dashboard(UID, TITLE, "Telemetry flow, consumer lag, dead letters, stale hosts, spool depth.",
                     panels, tags=["pipeline"])
