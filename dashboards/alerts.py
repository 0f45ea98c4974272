"""Prometheus alert rules as code, beside the dashboards that read the same series.

Every rule is a value (:class:`AlertRule`); :func:`render` turns the groups into the Prometheus
rule-file YAML that ``fleethealth dashboards build`` writes to ``dashboards/alerts/`` (the drift
test fails when the committed file differs). ``promtool check rules`` and ``promtool test rules``
run over it in ``tests/dashboards/test_alerts.py``, and a private Prometheus evaluates it there.

Every alert keeps the ``cluster`` label (a scrape-target label, see ``deploy/prometheus``) so one
Alertmanager can route several fleets. The Xid alert's list comes from NVIDIA's catalog
(``fleethealth/data/xid_catalog.tsv``): hardware Xids page, application Xids do not.
Throttle reasons are NVML clocks-event bits; PromQL has no bitwise AND, so bit ``b`` of the
gauge is ``floor(x / 2^b) % 2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from fleethealth import metrics_names as m
from fleethealth.xid import xid_table

SEVERITIES = ("critical", "warning", "info")
RULE_FILE = "fleethealth-alerts.yaml"


@dataclass(frozen=True, slots=True)
class AlertRule:
    name: str
    expr: str
    severity: str
    summary: str
    description: str
    for_: str = "0s"
    labels: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        if self.severity not in SEVERITIES:
            raise ValueError(f"alert {self.name}: severity {self.severity!r} is not one of {SEVERITIES}")
        out: dict[str, object] = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0s":
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity, **self.labels}
        out["annotations"] = {"summary": self.summary, "description": self.description}
        return out


@dataclass(frozen=True, slots=True)
class AlertGroup:
    name: str
    rules: tuple[AlertRule, ...]
    interval: str = "30s"


def bit(expr: str, b: int) -> str:
    """Bit ``b`` (0 = least significant) of a bitmask gauge, as 0 or 1."""
    return f"floor({expr} / {2 ** b}) % 2"


def hardware_xids() -> list[int]:
    """Xids whose catalog label is a hardware failure mode (not app_error, not informational,
    not the predictive SBE storm, which has its own ticket path)."""
    return sorted(x for x, info in xid_table().items()
                  if info.failure_mode and info.failure_mode not in ("app_error", "gpu_ecc_sbe_storm"))


GPU = "cluster, host, gpu"
HOST = "{{ $labels.host }}"
ON_GPU = "GPU {{ $labels.gpu }} on {{ $labels.host }}"


def _gpu_rules() -> tuple[AlertRule, ...]:
    reasons = "fleethealth_gpu_clocks_event_reasons"
    # A Xid series appears with its first event (value 1): increase() cannot see that one, so a
    # series younger than the window counts as an event too.
    listed = "|".join(str(x) for x in hardware_xids())
    xid = f'fleethealth_gpu_xid_events_total{{xid=~"{listed}"}}'
    return (
        AlertRule("FleetHealthGpuLost", "max by (cluster, host, gpu) (fleethealth_gpu_present) == 0", "critical",
                  f"{ON_GPU} is lost",
                  "NVML no longer reads this GPU (fell off the bus, GPU_IS_LOST or not enumerated).", "1m"),
        AlertRule("FleetHealthGpuNvmlError",
                  "max by (cluster, host, gpu, error) (fleethealth_gpu_nvml_error) == 1", "warning",
                  f"NVML reports {{{{ $labels.error }}}} for {ON_GPU}",
                  "NVML keeps failing for this GPU; the collector reads nothing else from it.", "5m"),
        AlertRule("FleetHealthGpuHardwareXid",
                  f"sum by ({GPU}, xid) ((increase({xid}[10m]) > 0) or ({xid} unless {xid} offset 10m)) > 0",
                  "critical", f"Xid {{{{ $labels.xid }}}} on {ON_GPU}",
                  "A Xid that NVIDIA's catalog resolves by GPU reset, reboot, NVLink workflow or RMA."),
        AlertRule("FleetHealthGpuUncorrectableEcc",
                  f'sum by ({GPU}, location) (increase(fleethealth_gpu_ecc_errors_total'
                  f'{{type="uncorrected", scope="volatile"}}[10m])) > 0',
                  "critical", f"Uncorrectable {{{{ $labels.location }}}} ECC error on {ON_GPU}",
                  "Volatile uncorrectable ECC errors rose in the last 10 minutes."),
        AlertRule("FleetHealthGpuRowRemapFailure", f"max by ({GPU}) (fleethealth_gpu_remap_failure) == 1",
                  "critical", f"Row remapping failed on {ON_GPU}", "A row remap failed: the GPU needs an RMA."),
        AlertRule("FleetHealthGpuRowRemapPending", f"max by ({GPU}) (fleethealth_gpu_remap_pending) == 1",
                  "warning", f"Row remap pending on {ON_GPU}",
                  "A row remap waits for a GPU reset; until then the row is not replaced.", "15m"),
        AlertRule("FleetHealthGpuSramThreshold", f"max by ({GPU}) (fleethealth_gpu_sram_threshold_exceeded) == 1",
                  "warning", f"SRAM uncorrectable errors past NVIDIA's threshold on {ON_GPU}",
                  "NVIDIA's SRAM threshold flag is set: open an RMA."),
        AlertRule("FleetHealthGpuHwSlowdown", f"max by ({GPU}) ({bit(reasons, 3)}) == 1", "warning",
                  f"HW slowdown on {ON_GPU}",
                  "Clocks-event reason 0x8 (HW slowdown: thermal or power brake) held for 10 minutes.", "10m"),
        AlertRule("FleetHealthGpuPowerBrake", f"max by ({GPU}) ({bit(reasons, 7)}) == 1", "warning",
                  f"HW power brake on {ON_GPU}",
                  "Clocks-event reason 0x80: the power brake (external signal, often the PSU or PDU) slows the "
                  "GPU.", "5m"),
        AlertRule("FleetHealthGpuThermalSlowdown",
                  f"max by ({GPU}) ({bit(reasons, 5)} or {bit(reasons, 6)}) == 1", "warning",
                  f"Thermal slowdown on {ON_GPU}", "Clocks-event reason 0x20 or 0x40 held for 10 minutes.",
                  "10m"),
        AlertRule("FleetHealthGpuHot", f"max by ({GPU}) (fleethealth_gpu_temperature_celsius)"
                  f' >= min by ({GPU}) (fleethealth_gpu_temperature_threshold_celsius{{threshold="slowdown"}})',
                  "warning", f"{ON_GPU} at {{{{ $value }}}} C",
                  "At or above this board's own slowdown temperature (NVML threshold) for 10 minutes.", "10m"),
        AlertRule("FleetHealthGpuPcieWidthDegraded",
                  f'max by ({GPU}) (fleethealth_gpu_pcie_link_width{{kind="current"}})'
                  f' < max by ({GPU}) (fleethealth_gpu_pcie_link_width{{kind="max"}})'
                  f' unless max by ({GPU}) (fleethealth_gpu_pcie_link_width{{kind="current"}})'
                  f' >= max by ({GPU}) (fleethealth_gpu_pcie_slot_link_width)',
                  "warning", f"PCIe link of {ON_GPU} runs at x{{{{ $value }}}}",
                  "The GPU's PCIe link trained below its maximum width and below its slot's width where the "
                  "slot is known (an x8 slot wired x8 is not a fault; generation drops at idle are normal).",
                  "15m"),
    )


def _host_rules() -> tuple[AlertRule, ...]:
    return (
        AlertRule("FleetHealthPcieUncorrectable",
                  'sum by (cluster, host, pci) (increase(fleethealth_pcie_aer_errors_total'
                  '{severity=~"fatal|nonfatal"}[10m])) > 0', "critical",
                  f"Uncorrectable PCIe AER errors on {{{{ $labels.pci }}}} of {HOST}",
                  "AER fatal or non-fatal errors rose in the last 10 minutes."),
        AlertRule("FleetHealthNetPortDown",
                  'max by (cluster, host, device, port, state) (fleethealth_net_port_state{state!="ACTIVE"}) == 1',
                  "warning", f"Port {{{{ $labels.device }}}}/{{{{ $labels.port }}}} on {HOST} is "
                             "{{ $labels.state }}",
                  "An InfiniBand / RoCE port is not ACTIVE. Many at once in one rack: suspect the leaf switch.",
                  "2m"),
        AlertRule("FleetHealthNetPortsDownInCluster",
                  'count by (cluster) (max by (cluster, host) (fleethealth_net_port_state{state!="ACTIVE"})) >= 5',
                  "critical", "{{ $value }} hosts of {{ $labels.cluster }} have a port down",
                  "Many hosts lost a port together: a switch, not the hosts. See the common-cause incident.",
                  "2m"),
        AlertRule("FleetHealthHostDramUncorrectable",
                  'sum by (cluster, host, mc) (increase(fleethealth_edac_errors_total{type="ue"}[10m])) > 0',
                  "critical", f"Uncorrectable DRAM error on memory controller {{{{ $labels.mc }}}} of {HOST}",
                  "EDAC uncorrectable errors rose in the last 10 minutes."),
        AlertRule("FleetHealthCollectorDown", 'up{job="fleethealth-collector"} == 0', "warning",
                  "Collector {{ $labels.instance }} is not scraped",
                  "Prometheus cannot scrape the collector's exporter.", "3m"),
        AlertRule("FleetHealthCollectorSpooling", f"max by (cluster, host) ({m.COLLECTOR_SPOOL}) > 0", "warning",
                  f"{HOST} spools {{{{ $value }}}} samples", "The collector cannot deliver to Kafka.", "10m"),
        AlertRule("FleetHealthCollectorSpoolDropping",
                  "sum by (cluster, host) (increase(fleethealth_collector_spool_dropped_total[15m])) > 0",
                  "critical", f"{HOST} drops telemetry", "The collector's spool is full: samples are lost."),
    )


def _pipeline_rules() -> tuple[AlertRule, ...]:
    return (
        AlertRule("FleetHealthServiceDown", 'up{job="fleethealth-services"} == 0', "critical",
                  "fleethealth {{ $labels.service }} at {{ $labels.instance }} is down",
                  "Prometheus cannot scrape a fleet service (detect, remediate, fleet-metrics).", "2m"),
        AlertRule("FleetHealthConsumerLag", f"max by (cluster, group, topic) ({m.CONSUMER_LAG}) > 10000",
                  "warning", "{{ $labels.group }} lags {{ $value }} messages on {{ $labels.topic }}",
                  "A consumer group falls behind, so detection and remediation are late.", "10m"),
        AlertRule("FleetHealthDeadLetters", f"sum by (cluster) (increase({m.DEAD_LETTERS}[15m])) > 0",
                  "warning", "{{ $value | printf \"%.0f\" }} messages dead-lettered in {{ $labels.cluster }}",
                  "Messages were rejected (malformed, unknown host, schema); read fleet.deadletter.v1."),
        AlertRule("FleetHealthStaleHosts", f"max by (cluster) ({m.STALE_HOSTS}) > 0", "warning",
                  "{{ $value }} hosts of {{ $labels.cluster }} stopped reporting",
                  "Hosts silent past the staleness threshold; the host_unreachable rule follows.", "5m"),
    )


def _remediation_rules() -> tuple[AlertRule, ...]:
    drained = f'sum by (cluster) ({m.HOSTS}{{state=~"drained|in_repair"}})'
    return (
        AlertRule("FleetHealthDrainedFractionHigh", f"{drained} / sum by (cluster) ({m.HOSTS}) > 0.1", "critical",
                  "{{ $value | humanizePercentage }} of {{ $labels.cluster }} is drained or in repair",
                  "More than 10 % of the fleet is out of service.", "10m"),
        AlertRule("FleetHealthCommonCause", f"max by (cluster, kind) ({m.COMMON_CAUSE_OPEN}) > 0", "critical",
                  "{{ $value }} {{ $labels.kind }} common-cause incident(s) open in {{ $labels.cluster }}",
                  "Hosts sharing one part failed together: one ticket names the part; their drains are held "
                  "behind it (remediation/common_cause.py). One alert per kind of part, not one per host."),
        AlertRule("FleetHealthDrainsQueued", f"max by (cluster) ({m.NODES_QUEUED}) > 0", "warning",
                  "{{ $value }} remediation actions queued in {{ $labels.cluster }}",
                  "A guard (cluster or rack cap, rate window, common cause) holds drains back.", "30m"),
        AlertRule("FleetHealthTicketsAging", f'sum by (cluster) ({m.TICKETS_OPEN}{{age_bucket=~"7d_30d|gt_30d"}}) > 0',
                  "info", "{{ $value }} repair tickets older than 7 days in {{ $labels.cluster }}",
                  "Drained hosts wait for repair for more than a week.", "1h"),
    )


def groups() -> tuple[AlertGroup, ...]:
    return (
        AlertGroup("fleethealth-gpu", _gpu_rules()),
        AlertGroup("fleethealth-host", _host_rules()),
        AlertGroup("fleethealth-pipeline", _pipeline_rules()),
        AlertGroup("fleethealth-remediation", _remediation_rules()),
    )


def rules() -> list[AlertRule]:
    return [r for g in groups() for r in g.rules]


HEADER = ("# Built by `fleethealth dashboards build` from dashboards/alerts.py; do not edit by hand.\n"
          "# Load with Prometheus's rule_files (see deploy/prometheus and docs/deploy.md).\n")


def render() -> str:
    names = [r.name for r in rules()]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"alert names used twice: {dup}")
    doc = {"groups": [{"name": g.name, "interval": g.interval, "rules": [r.to_dict() for r in g.rules]}
                      for g in groups()]}
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=4096, allow_unicode=True)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the ConfigMap shows the rule file as written."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_BlockDumper.add_representer(str, _str)


def render_configmap(namespace: str = "fleethealth") -> str:
    """The rule file as a Kubernetes ConfigMap, mounted at /etc/prometheus/rules by
    deploy/kubernetes/prometheus-config.yaml's Prometheus."""
    doc = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "fleethealth-prometheus-rules", "namespace": namespace,
                        "labels": {"app.kubernetes.io/part-of": "fleethealth"}},
           "data": {RULE_FILE: render()}}
    return HEADER + yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False, width=4096, allow_unicode=True)
