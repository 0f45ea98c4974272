"""What hosts share: racks, leaf switches, PDUs, driver and firmware versions — from the operator.

Common-cause incidents (:mod:`remediation.common_cause`) group failing hosts by these parts, and a
group decides whether drains are held, so membership never comes from a message: a sample's or an
incident's ``rack`` / ``cluster`` labels are claims of the sender. It comes from

* the operator's topology file (YAML, ``[common_cause].topology``)::

      version: 1
      switch: {leaf-01: "gpu-node-[001-032]", leaf-02: "gpu-node-[033-064]"}
      rack:   {r01: "gpu-node-[001-016]", r02: [gpu-node-017, gpu-node-018]}
      pdu:    {pdu-a1: "gpu-node-[001-008]"}
      driver: {"550.54.15": "gpu-node-[001-048]"}
      firmware: {"96.00.9F.00.04": "gpu-node-[001-064]"}

* and Slurm's own tree topology (``scontrol show topology``: ``SwitchName=leaf1 Level=0 ...
  Nodes=gpu-node-[001-004]``), leaf switches only (level 0), when ``[common_cause].slurm_topology``.

Pure parsing here; reading files and running scontrol are the callers' edges.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleethealth.errors import UserError

KINDS = ("switch", "pdu", "rack", "driver", "firmware")  # most specific physical part first


class TopologyError(UserError):
    """A topology file or scontrol output that cannot be read; the message names the source."""


def expand_hosts(expr: str) -> list[str]:
    from remediation.scheduler import expand_hostlist

    return expand_hostlist(expr)


@dataclass(frozen=True, slots=True)
class Group:
    kind: str
    name: str
    hosts: frozenset[str]

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"


@dataclass(slots=True)
class Topology:
    groups: dict[str, Group] = field(default_factory=dict)  # key -> group
    _by_host: dict[str, list[Group]] = field(default_factory=dict)

    def add(self, g: Group) -> None:
        old = self.groups.get(g.key)
        if old is not None:  # the file and Slurm name the same switch: one group, union of members
            g = Group(g.kind, g.name, old.hosts | g.hosts)
            for h in old.hosts:
                self._by_host[h] = [x for x in self._by_host.get(h, []) if x.key != g.key]
        self.groups[g.key] = g
        for h in g.hosts:
            self._by_host.setdefault(h, []).append(g)

    def of_host(self, host: str) -> list[Group]:
        return list(self._by_host.get(host, ()))

    def __len__(self) -> int:
        return len(self.groups)


def parse_topology_file(text: str, source: str = "topology.yaml") -> Topology:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TopologyError(f"{source}: not YAML: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise TopologyError(f"{source}: expected a mapping with 'version: 1'")
    topo = Topology()
    for kind, members in doc.items():
        if kind == "version":
            continue
        if kind not in KINDS:
            raise TopologyError(f"{source}: unknown part kind {kind!r} (one of {', '.join(KINDS)})")
        if not isinstance(members, dict):
            raise TopologyError(f"{source}: {kind}: expected a mapping of name -> host list")
        for name, hosts in members.items():
            topo.add(Group(kind, str(name), frozenset(_hosts(hosts, f"{source}: {kind}.{name}"))))
    return topo


def _hosts(value: Any, where: str) -> list[str]:
    items: Iterable[Any] = [value] if isinstance(value, str) else value if isinstance(value, list) else None  # type: ignore[assignment]
    if items is None:
        raise TopologyError(f"{where}: expected a host list string or a list of them")
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TopologyError(f"{where}: {item!r} is not a host name")
        try:
            out += expand_hosts(item)
        except ValueError as exc:
            raise TopologyError(f"{where}: {exc}") from None
    if not out:
        raise TopologyError(f"{where}: no hosts")
    return out


def load_topology_file(path: str | Path) -> Topology:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(f"{p}: cannot read the topology file: {exc}") from None
    return parse_topology_file(text, str(p))


_SWITCH = re.compile(r"^SwitchName=(?P<name>\S+)\s+Level=(?P<level>\d+)\b(?P<rest>.*)$")
_NODES = re.compile(r"\bNodes=(?P<nodes>\S+)")


def parse_slurm_topology(text: str, into: Topology | None = None) -> Topology:
    """Leaf switches (level 0) of ``scontrol show topology`` as ``switch`` groups."""
    topo = into if into is not None else Topology()
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _SWITCH.match(line.strip())
        if not m or m.group("level") != "0":
            continue
        n = _NODES.search(m.group("rest"))
        if not n:
            continue
        try:
            hosts = expand_hosts(n.group("nodes"))
        except ValueError as exc:
            raise TopologyError(f"scontrol show topology line {lineno}: {exc}") from None
        topo.add(Group("switch", m.group("name"), frozenset(hosts)))
    return topo
