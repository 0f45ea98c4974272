"""FleetState folds samples, incidents and actions into host states; the collector exports them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from fleetcli.fleet_metrics import CountingBus, FleetState, FleetStateCollector
from fleethealth import metrics_names as m
from fleethealth.bus import DEADLETTER, TELEMETRY, InProcessBus
from fleethealth.schema import ActionRecord, Incident
from tests.spine.sample_factory import sample

T0 = 1_764_000_000.0


def incident(host: str, mode: str = "gpu_dram_uce", state: str = "open", iid: str = "") -> Incident:
    return Incident(id=iid or f"{host}-{mode}", host=host, rack="r01", component="GPU-0", failure_mode=mode,
                    severity="critical", confidence=0.9, detector="rule:test", first_seen=T0, last_seen=T0,
                    state=state)


def action(host: str, kind: str, outcome: str, iid: str) -> ActionRecord:
    return ActionRecord(id=f"{iid}:{kind}", incident_id=iid, host=host, kind=kind, outcome=outcome, ts=T0 + 10)


def test_host_states_follow_incidents_drains_and_tickets() -> None:
    st = FleetState()
    for i, h in enumerate(["a", "b", "c", "d", "e"]):
        st.observe_sample(sample(host=h, ts=T0 + i), received_at=100.0)
    st.observe_incident(incident("b"))
    st.observe_incident(incident("c"))
    st.observe_action(action("c", "drain", "dry_run", "c-gpu_dram_uce"))
    st.observe_incident(incident("d"))
    st.observe_action(action("d", "drain", "done", "d-gpu_dram_uce"))
    st.observe_action(action("d", "ticket_opened", "done", "d-gpu_dram_uce"))
    st.observe_incident(incident("e"))
    st.observe_incident(incident("e", state="resolved"))
    assert st.host_states() == {"a": "healthy", "b": "suspect", "c": "drained", "d": "in_repair",
                                "e": "healthy"}
    st.observe_action(action("c", "resume", "done", "c-gpu_dram_uce"))
    st.observe_incident(incident("c", state="resolved"))
    assert st.host_states()["c"] == "healthy"
    st.close_ticket("d-gpu_dram_uce")
    assert st.host_states()["d"] == "drained"


def test_refused_drain_leaves_host_suspect() -> None:
    st = FleetState()
    st.observe_sample(sample(host="a"), received_at=1.0)
    st.observe_incident(incident("a"))
    st.observe_action(action("a", "drain", "refused", "a-gpu_dram_uce"))
    assert st.host_states() == {"a": "suspect"}


def _scrape(col: FleetStateCollector) -> str:
    reg = CollectorRegistry()
    reg.register(col)
    return generate_latest(reg).decode()


def test_collector_exports_states_incidents_lag_and_ages() -> None:
    inner = InProcessBus(partitions=2)
    bus = CountingBus(inner)
    st = FleetState(stale_after_s=30)
    s_new, s_old = sample(host="new", ts=T0), sample(host="old", ts=T0 - 60)
    for s in (s_new, s_old):
        bus.publish(TELEMETRY, s.host, b"{}")
    bus.publish(DEADLETTER, None, b"{}")
    st.observe_sample(s_new, received_at=1000.0)
    st.observe_sample(s_old, received_at=950.0)
    st.observe_incident(incident("new", "pcie_fatal"))
    c = inner.consumer([TELEMETRY], "detect")
    c.poll(timeout=0, max_records=1)
    c.commit()
    col = FleetStateCollector(st, bus, lag=lambda: [("detect", TELEMETRY, inner.lag("detect", TELEMETRY))],
                              clock=lambda: 1010.0)
    text = _scrape(col)
    assert f'{m.HOSTS}{{state="healthy"}} 1.0' in text
    assert f'{m.HOSTS}{{state="suspect"}} 1.0' in text
    assert f'{m.HOSTS}{{state="drained"}} 0.0' in text
    assert f'{m.INCIDENTS_OPEN}{{failure_mode="pcie_fatal",host="new",rack="r01",severity="critical"}} 1.0' in text
    assert f'{m.INCIDENT_MESSAGES}{{failure_mode="pcie_fatal",state="open"}} 1.0' in text
    assert f'{m.LAST_SAMPLE_AGE}{{host="old",rack="r01"}} 60.0' in text
    assert f'{m.LAST_SAMPLE_AGE}{{host="new",rack="r01"}} 10.0' in text
    assert f"{m.STALE_HOSTS} 1.0" in text
    assert f"{m.SAMPLES} 2.0" in text
    assert f"{m.DEAD_LETTERS} 1.0" in text
    assert f'{m.CONSUMER_LAG}{{group="detect",topic="{TELEMETRY}"}} 1.0' in text


def test_lag_of_unknown_topic_or_group() -> None:
    bus = InProcessBus(partitions=2)
    assert bus.lag("g", "nothing") == 0
    bus.publish("t", "k", b"x")
    assert bus.lag("never-consumed", "t") == 1
