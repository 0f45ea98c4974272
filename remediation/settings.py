"""Configuration of the remediation part: the ``[remediation]``, ``[guards]``, ``[slurm]``,
``[kubernetes]`` and ``[tickets]`` sections of the TOML config, each validated with file + key
errors by :func:`fleethealth.config.section`.

Every guard setting is bounded: a value that would switch a guard off (``inf``, NaN, an allowance of
a million nodes, a rate window of a second) fails start-up naming the file and key, because an
operator who wanted a guard off has the kill switch's opposite, not a typo, to say so."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from fleethealth.config import Config, ConfigError

Fraction = Annotated[float, Meta(gt=0.0, le=1.0)]
PosInt = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(gt=0.0, le=86400.0 * 366)]
DAY = 86400.0
HookSpec = list[str] | str | None  # argv template, or an http(s):// URL


class _S(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class HookSettings(_S):
    """Operator hooks. A list is an argv template (``{host}``, ``{component}``, ``{incident}``,
    ``{failure_mode}``, ``{node}``, ``{reason}`` are filled in); a string starting with http is a
    webhook that gets the action as JSON. No hook -> the request is recorded as skipped."""

    reset_gpu: HookSpec = None
    reboot: HookSpec = None
    alert: HookSpec = None
    annotate: HookSpec = None
    # Run before a node is resumed ({node}, {host}); exit 0 / 2xx = the node passed and may resume.
    post_repair_check: HookSpec = None
    post_repair_retry_s: Annotated[float, Meta(ge=10.0, le=DAY)] = 600.0  # after a failed check
    timeout_s: Annotated[float, Meta(gt=0.0, le=3600.0)] = 30.0
    # Where remediation runs on the GPU host itself (``fleethealth run``, a per-host worker): the
    # collector's pause file (its STATE_DIR/nvml.pause). The reset_gpu hook is then called only
    # while NVML is released (fleethealth/nvml_pause.py) and the file is removed afterwards. On a
    # fleet, the host-side ``fleethealth reset-gpu`` does the same around nvidia-smi -r.
    nvml_pause_file: str | None = None
    nvml_release_wait_s: Annotated[float, Meta(gt=0.0, le=600.0)] = 60.0


class GuardSettings(_S):
    """The safety guards. Group sizes, drained counts and rack membership come from the scheduler's
    node list (or the operator's ``nodes`` / ``racks`` below), never from labels in a message."""

    max_drain_fraction: Fraction = 0.10  # of a group (cluster or partition) unavailable at once
    min_drain_allowance: Annotated[int, Meta(ge=0, le=64)] = 1  # a tiny group may still drain this many
    max_drained_per_rack: Annotated[int, Meta(ge=0, le=256)] = 2
    drains_per_host: Annotated[int, Meta(ge=1, le=10)] = 1  # per rate_window_s
    rate_window_s: Annotated[float, Meta(ge=60.0, le=7 * DAY)] = 3600.0
    max_incident_age_s: Annotated[float, Meta(ge=1.0, le=DAY)] = 900.0  # never act on an older incident
    kill_switch: bool = False
    kill_switch_file: str | None = None  # the file existing engages the switch
    # What a cap is taken over: the whole scheduler ("cluster"), or each Slurm partition / each value
    # of [kubernetes].group_label ("group"; a node in several partitions must fit every one).
    cap_scope: Literal["cluster", "group"] = "cluster"
    # Which unavailable nodes count against a cap: every drained/down/cordoned node the scheduler
    # shows ("all": capacity already lost, whoever took it) or only those drained by fleethealth.
    count_drained: Literal["all", "fleethealth"] = "all"
    racks: dict[str, list[str]] = {}  # rack -> Slurm-style host lists; overrides the scheduler's rack
    nodes: list[str] = []  # static inventory (host lists) for --scheduler none (dry runs)
    inventory_ttl_s: Annotated[float, Meta(ge=0.0, le=300.0)] = 10.0  # re-read the node list this often


class SlurmSettings(_S):
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    timeout_s: Annotated[float, Meta(gt=0.0, le=600.0)] = 15.0
    node_names: dict[str, str] = {}  # host name -> Slurm NodeName (identity when absent)
    rack_feature_prefix: str | None = None  # e.g. "rack_": node feature rack_r07 puts the node in rack r07


class KubeSettings(_S):
    kubeconfig: str | None = None
    context: str | None = None
    host: str | None = None  # API server URL; overrides kubeconfig (tests, in-cluster proxies)
    evict: bool = True
    # "evict": evict the node's pods right after the cordon; "wait": let them run to completion and
    # evict what still runs after wait_deadline_s (remediation/jobs.py explains when each fits)
    drain_mode: Literal["evict", "wait"] = "evict"
    wait_deadline_s: Annotated[float, Meta(ge=60.0, le=7 * DAY)] = 4 * 3600.0
    request_timeout_s: Annotated[float, Meta(gt=0.0, le=600.0)] = 10.0
    node_names: dict[str, str] = {}
    group_label: str | None = None  # node label whose value is the node group (cap_scope = "group")
    rack_label: str | None = None  # node label whose value is the rack, e.g. "topology.example.com/rack"


class TicketSettings(_S):
    webhook: str | None = None
    webhook_timeout_s: Annotated[float, Meta(gt=0.0, le=300.0)] = 5.0
    webhook_attempts: Annotated[int, Meta(ge=1, le=20)] = 3
    webhook_backoff_s: Annotated[float, Meta(ge=0.0, le=300.0)] = 0.5
    recurrence_window_days: Annotated[float, Meta(gt=0.0, le=3650.0)] = 30.0


class RemediationSettings(_S):
    policy: str | None = None  # None -> remediation/policy/default.yaml
    db: str = "fleethealth-remediation.sqlite"
    scheduler: Literal["slurm", "kubernetes", "none"] = "none"
    dry_run: bool = False
    group: str = "fleethealth-remediation"
    hooks: HookSettings = msgspec.field(default_factory=HookSettings)


DEFAULT_COMMON_CAUSE_MODES = {  # part kind -> failure modes a fault of that part shows on its hosts
    "switch": ["net_link_down", "net_link_bad_cable"],
    "pdu": ["host_unreachable", "gpu_fell_off_bus"],
    "rack": ["host_unreachable"],
    "driver": ["gpu_fell_off_bus", "gpu_hw_error", "gpu_gsp_error", "gpu_nvlink_error"],
    "firmware": ["gpu_fell_off_bus", "gpu_hw_error", "gpu_gsp_error", "gpu_nvlink_error", "net_link_down"],
}


class CommonCauseSettings(_S):
    """``[common_cause]`` (remediation/common_cause.py): where what hosts share comes from, and when
    a burst of failures is one fault of the shared part."""

    topology: str | None = None  # the operator's topology file (remediation/topology.py)
    slurm_topology: bool = False  # also read leaf switches from `scontrol show topology`
    window_s: Seconds = 600.0  # failures this close together (receiver time) count together
    settle_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 30.0  # an explainable incident waits this long
    min_hosts: Annotated[int, Meta(ge=2, le=100_000)] = 3
    min_fraction: Fraction = 0.1  # of the group's hosts
    modes: dict[str, list[str]] = msgspec.field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_COMMON_CAUSE_MODES.items()})


class JobSettings(_S):
    """``[jobs]`` (remediation/jobs.py): what a drain does to the jobs on the node."""

    deadline_s: Annotated[float, Meta(ge=60.0, le=7 * DAY)] = 4 * 3600.0  # predictive: jobs may finish until
    squeue: str = "squeue"


class VerifySettings(_S):
    """``[verify]`` (remediation/verify.py): the command a repaired node must pass before it resumes."""

    command: str | None = None  # e.g. "dcgmi diag -r 2"; None: resume without one
    time_limit_min: Annotated[int, Meta(ge=1, le=24 * 60)] = 30
    output_dir: str = ""  # where the job writes its output (shared storage); default /tmp on the node
    sbatch: str = "sbatch"
    image: str = "nvcr.io/nvidia/cloud-native/dcgm:latest"  # Kubernetes: the image the Job runs the command in
    namespace: str = "fleethealth"  # Kubernetes: where the verification Jobs go


class AllSettings(_S):
    remediation: RemediationSettings = msgspec.field(default_factory=RemediationSettings)
    guards: GuardSettings = msgspec.field(default_factory=GuardSettings)
    slurm: SlurmSettings = msgspec.field(default_factory=SlurmSettings)
    kubernetes: KubeSettings = msgspec.field(default_factory=KubeSettings)
    tickets: TicketSettings = msgspec.field(default_factory=TicketSettings)
    common_cause: CommonCauseSettings = msgspec.field(default_factory=CommonCauseSettings)
    jobs: JobSettings = msgspec.field(default_factory=JobSettings)
    verify: VerifySettings = msgspec.field(default_factory=VerifySettings)


REMOVED = {
    "cluster_sizes": "group sizes now come from the scheduler's node list (or [guards].nodes for "
                     "--scheduler none); a size keyed by a message's cluster label is what a forged label bypassed",
}


def _finite(cfg: Config, where: str, data: Any) -> None:
    """NaN / inf anywhere in a section is an error naming the key (bounds alone let NaN through)."""
    if isinstance(data, dict):
        for k, v in data.items():
            _finite(cfg, f"{where}.{k}", v)
    elif isinstance(data, float) and not math.isfinite(data):
        raise ConfigError(f"{cfg.name}: {where}: {data!r} is not a finite number")


def load_settings(cfg: Config | None = None) -> AllSettings:
    cfg = cfg or Config({}, None)
    for name in ("remediation", "guards", "slurm", "kubernetes", "tickets", "common_cause", "jobs", "verify"):
        _finite(cfg, f"[{name}]", cfg.raw.get(name, {}))
    for key, why in REMOVED.items():
        if key in cfg.raw.get("guards", {}):
            raise ConfigError(f"{cfg.name}: [guards].{key}: no longer read: {why}")
    s = AllSettings(
        remediation=cfg.section("remediation", RemediationSettings),
        guards=cfg.section("guards", GuardSettings),
        slurm=cfg.section("slurm", SlurmSettings),
        kubernetes=cfg.section("kubernetes", KubeSettings),
        tickets=cfg.section("tickets", TicketSettings),
        common_cause=cfg.section("common_cause", CommonCauseSettings),
        jobs=cfg.section("jobs", JobSettings),
        verify=cfg.section("verify", VerifySettings),
    )
    for name in ("reset_gpu", "reboot", "alert", "annotate"):
        spec = getattr(s.remediation.hooks, name)
        if isinstance(spec, str) and not spec.startswith(("http://", "https://")):
            raise ConfigError(f"{cfg.name}: [remediation.hooks].{name}: a string hook must be an http(s) URL; "
                              "give a command as a list, e.g. [\"/usr/local/bin/request-reset\", \"{host}\"]")
        if isinstance(spec, list) and not spec:
            raise ConfigError(f"{cfg.name}: [remediation.hooks].{name}: empty command")
    check_guards(s.guards, cfg.name)
    return s


def check_guards(g: GuardSettings, where: str = "<settings>") -> None:
    """Checks msgspec bounds cannot express; also run on values set from the command line."""
    for k in ("max_drain_fraction", "rate_window_s", "max_incident_age_s", "inventory_ttl_s"):
        v = getattr(g, k)
        if not math.isfinite(v):
            raise ConfigError(f"{where}: [guards].{k}: {v!r} is not a finite number")
    if not 1.0 <= g.max_incident_age_s <= DAY:
        raise ConfigError(f"{where}: [guards].max_incident_age_s: {g.max_incident_age_s!r} is outside "
                          f"1..{DAY:.0f} s (a larger bound acts on day-old incidents)")
    from remediation.scheduler import expand_hostlist

    for rack, lists in g.racks.items():
        for expr in lists:
            try:
                expand_hostlist(expr)
            except ValueError as exc:
                raise ConfigError(f"{where}: [guards].racks.{rack}: {exc}") from None
    for expr in g.nodes:
        try:
            expand_hostlist(expr)
        except ValueError as exc:
            raise ConfigError(f"{where}: [guards].nodes: {exc}") from None
