"""Configuration of the remediation part: the ``[remediation]``, ``[guards]``, ``[slurm]``,
``[kubernetes]`` and ``[tickets]`` sections of the TOML config, each validated with file + key
errors by :func:`fleethealth.config.section`."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from fleethealth.config import Config, ConfigError

Fraction = Annotated[float, Meta(gt=0.0, le=1.0)]
PosInt = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(gt=0.0)]
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
    timeout_s: Seconds = 30.0


class GuardSettings(_S):
    max_drain_fraction: Fraction = 0.10  # of a cluster drained by fleethealth at once
    min_drain_allowance: PosInt = 1  # a tiny cluster may still drain this many
    max_drained_per_rack: PosInt = 2
    drains_per_host: PosInt = 1  # per rate_window_s
    rate_window_s: Seconds = 3600.0
    max_incident_age_s: Seconds = 900.0  # never act on an incident last seen longer ago
    kill_switch: bool = False
    kill_switch_file: str | None = None  # the file existing engages the switch
    cluster_sizes: dict[str, Annotated[int, Meta(ge=1)]] = {}  # else asked of the scheduler


class SlurmSettings(_S):
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    timeout_s: Seconds = 15.0
    node_names: dict[str, str] = {}  # host name -> Slurm NodeName (identity when absent)


class KubeSettings(_S):
    kubeconfig: str | None = None
    context: str | None = None
    host: str | None = None  # API server URL; overrides kubeconfig (tests, in-cluster proxies)
    evict: bool = True
    request_timeout_s: Seconds = 10.0
    node_names: dict[str, str] = {}


class TicketSettings(_S):
    webhook: str | None = None
    webhook_timeout_s: Seconds = 5.0
    webhook_attempts: Annotated[int, Meta(ge=1, le=20)] = 3
    webhook_backoff_s: Annotated[float, Meta(ge=0.0)] = 0.5
    recurrence_window_days: Seconds = 30.0


class RemediationSettings(_S):
    policy: str | None = None  # None -> remediation/policy/default.yaml
    db: str = "fleethealth-remediation.sqlite"
    scheduler: Literal["slurm", "kubernetes", "none"] = "none"
    dry_run: bool = False
    group: str = "fleethealth-remediation"
    hooks: HookSettings = msgspec.field(default_factory=HookSettings)


class AllSettings(_S):
    remediation: RemediationSettings = msgspec.field(default_factory=RemediationSettings)
    guards: GuardSettings = msgspec.field(default_factory=GuardSettings)
    slurm: SlurmSettings = msgspec.field(default_factory=SlurmSettings)
    kubernetes: KubeSettings = msgspec.field(default_factory=KubeSettings)
    tickets: TicketSettings = msgspec.field(default_factory=TicketSettings)


def load_settings(cfg: Config | None = None) -> AllSettings:
    cfg = cfg or Config({}, None)
    s = AllSettings(
        remediation=cfg.section("remediation", RemediationSettings),
        guards=cfg.section("guards", GuardSettings),
        slurm=cfg.section("slurm", SlurmSettings),
        kubernetes=cfg.section("kubernetes", KubeSettings),
        tickets=cfg.section("tickets", TicketSettings),
    )
    for name in ("reset_gpu", "reboot", "alert", "annotate"):
        spec = getattr(s.remediation.hooks, name)
        if isinstance(spec, str) and not spec.startswith(("http://", "https://")):
            raise ConfigError(f"{cfg.name}: [remediation.hooks].{name}: a string hook must be an http(s) URL; "
                              "give a command as a list, e.g. [\"/usr/local/bin/request-reset\", \"{host}\"]")
        if isinstance(spec, list) and not spec:
            raise ConfigError(f"{cfg.name}: [remediation.hooks].{name}: empty command")
    return s
