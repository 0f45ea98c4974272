"""detect --exit-when-idle waits for the group to assign partitions: librdkafka's poll returns on
time while the consumer is still joining, and those empty polls are not the input being idle."""

from __future__ import annotations

from fleethealth.bus import InProcessBus, RebalancingConsumer


class JoiningConsumer:
    """A RebalancingConsumer over an in-process consumer that owns nothing for its first polls."""

    def __init__(self, inner, unassigned_polls: int) -> None:
        self.inner, self.left, self.polls = inner, unassigned_polls, 0

    def poll(self, timeout: float = 1.0, max_records: int = 500):
        self.polls += 1
        if self.left > 0:
            self.left -= 1
            return []
        return self.inner.poll(0, max_records)

    def commit(self) -> None:
        self.inner.commit()

    def close(self) -> None:
        self.inner.close()

    def assignment_changes(self):
        return []

    def assigned(self):
        return set() if self.left > 0 else {("t", 0)}

    def committed(self, partitions):
        return {tp: None for tp in partitions}

    def history(self, ends, window_s):
        return iter(())

    def highwater(self, tp):
        return None


def test_empty_polls_before_the_first_assignment_are_not_idle():
    from detectors.worker.worker import DetectWorker
    from fleethealth.schema import encode
    from tests.spine.sample_factory import sample

    bus = InProcessBus()
    for seq in range(3):
        bus.publish("t", "h1", encode(sample(host="h1", seq=seq, gpus=1)))
    made: list[JoiningConsumer] = []
    orig = bus.consumer

    def consumer(topics, group):
        made.append(JoiningConsumer(orig(topics, group), unassigned_polls=6))
        return made[-1]

    bus.consumer = consumer  # type: ignore[method-assign]
    clock = [0.0]
    w = DetectWorker(bus, topic="t", incidents_topic="i", deadletter_topic="d", idle_tick=False,
                     monotonic=lambda: clock[0])
    assert isinstance(w.consumer, RebalancingConsumer)
    stats = w.run(max_idle_polls=2)
    assert stats.samples == 3 and made[0].polls == 6 + 1 + 2
    # a member that never gets a partition still stops once the join grace has passed
    clock[0] = 0.0
    w2 = DetectWorker(bus, topic="t", group="other", incidents_topic="i", deadletter_topic="d", idle_tick=False,
                      monotonic=lambda: clock[0])
    made[-1].left = 10**9

    orig_poll = made[-1].poll

    def poll(timeout: float = 1.0, max_records: int = 500):
        clock[0] += DetectWorker.JOIN_GRACE_S / 4
        return orig_poll(timeout, max_records)

    made[-1].poll = poll  # type: ignore[method-assign]
    assert w2.run(max_idle_polls=2).samples == 0
