"""Counter deltas across resets, wraps and saturation; windows; flaps; seq admission; baselines."""

from __future__ import annotations

from detectors.engine.state import (
    MAX_WINDOW_EVENTS,
    Admission,
    EventWindow,
    FlapCounter,
    FleetBaseline,
    HostState,
    counter_delta,
)

U32 = 1 << 32


def test_first_sight_is_a_baseline_and_forward_steps_count():
    assert counter_delta(None, 500).delta == 0
    assert counter_delta(500, 503).delta == 3
    assert counter_delta(7, 7).delta == 0
    assert counter_delta(7, None).note == "missing"


def test_counter_going_backwards_is_a_reset_counting_the_new_value():
    s = counter_delta(1000, 4)
    assert (s.delta, s.note) == (4, "reset")


def test_u32_and_u64_wrap_near_the_top():
    s = counter_delta(U32 - 10, 5)
    assert (s.delta, s.note) == (15, "wrap")
    s = counter_delta((1 << 64) - 3, 2)
    assert (s.delta, s.note) == (5, "wrap")


def test_no_wrap_across_a_reboot_or_driver_change():
    s = counter_delta(U32 - 10, 5, epoch_changed=True)
    assert (s.delta, s.note) == (5, "reset")


def test_saturated_counters_count_once_then_stay_quiet():
    assert counter_delta(250, 255).note == "saturated"
    assert counter_delta(250, 255).delta == 5
    assert counter_delta(255, 255).delta == 0  # 8-bit link_downed stuck at 255: no storm
    assert counter_delta(U32 - 1, U32 - 1).delta == 0
    # a saturated counter never wraps: going down from all-ones is a clear
    assert counter_delta(U32 - 1, 3).note == "reset"


def test_event_window_sums_by_sample_time_and_stays_bounded():
    w = EventWindow()
    for i in range(10 * MAX_WINDOW_EVENTS):
        w.add(1000.0 + i, 1)
    assert len(w.events) <= MAX_WINDOW_EVENTS + 1
    assert w.sum(1000.0 + 10 * MAX_WINDOW_EVENTS, 1e9) == 10 * MAX_WINDOW_EVENTS  # sum survives merging
    assert w.sum(1e9, 60) == 0  # all expired
    w.add(5.0, 0)
    assert not w.events


def test_flap_counter_counts_changes_in_window():
    f = FlapCounter()
    states = ["ACTIVE", "DOWN", "ACTIVE", "DOWN", "ACTIVE"]
    counts = [f.observe(100.0 + 10 * i, s, 600) for i, s in enumerate(states)]
    assert counts == [0, 1, 2, 3, 4]
    assert f.observe(2000.0, "ACTIVE", 600) == 0


def test_admission_drops_duplicates_and_older_samples_and_counts_them():
    st = HostState("h")
    assert Admission.admit(st, 5, 100.0, "b1", "550") == ""
    assert Admission.admit(st, 5, 100.0, "b1", "550") == "duplicate"
    assert Admission.admit(st, 4, 90.0, "b1", "550") == "out_of_order"
    assert Admission.admit(st, 6, 110.0, "b1", "550") == ""
    assert (st.duplicates, st.out_of_order, st.samples) == (1, 1, 2)


def test_new_boot_restarts_seq_without_being_called_stale():
    st = HostState("h")
    Admission.admit(st, 900, 100.0, "b1", "550")
    assert Admission.admit(st, 0, 400.0, "b2", "550") == ""
    assert st.epoch_changed and st.resets == 1
    assert Admission.admit(st, 1, 410.0, "b2", "550") == ""
    assert not st.epoch_changed
    assert Admission.admit(st, 2, 420.0, "b2", "560") == ""  # driver update: another epoch
    assert st.epoch_changed


def test_fleet_baseline_percentile_counts_quiet_components_as_zero():
    b = FleetBaseline(refresh_s=60)
    for i in range(5):
        b.set("h", f"g{i}", 10.0)
    b.population = 100
    b.advance(0.0)
    assert b.percentile(50) == 0.0 and b.percentile(99) == 10.0
    b.population = 1000  # more components seen: read at the next refresh, not before
    b.set("h", "g5", 20.0)
    b.advance(59.9)
    assert b.percentile(99) == 10.0
    b.advance(30.0)  # an older sample (a lagging host) never refreshes
    assert b.percentile(99) == 10.0
    b.advance(60.0)
    assert b.percentile(99) == 0.0 and b.percentile(100) == 20.0
    b.clear()
    b.advance(0.0)
    assert b.percentile(99) == 0.0


def test_a_seq_that_restarts_with_newer_time_is_counted_and_kept():
    """A lost collector state file (seq from 0 on the same boot), a jump to 2**64-1 and back: the
    samples after it are newer in time, so they are a restarted count, never dropped."""
    st = HostState("h")
    assert Admission.admit(st, 40, 100.0, "b1", "550") == ""
    assert Admission.admit(st, 0, 110.0, "b1", "550") == ""  # state file lost: seq from 0
    assert Admission.admit(st, 2**64 - 1, 120.0, "b1", "550") == ""
    assert Admission.admit(st, 3, 130.0, "b1", "550") == ""  # back from 2**64-1
    assert Admission.admit(st, 4, 140.0, "b1", "550") == ""
    assert (st.seq_restarts, st.samples, st.last_seq) == (2, 5, 4)
    # a redelivered old sample is still dropped: not newer than what the host already said
    assert Admission.admit(st, 3, 130.0, "b1", "550") == "out_of_order"
    assert Admission.admit(st, 4, 140.0, "b1", "550") == "duplicate"
