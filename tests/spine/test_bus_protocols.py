"""The declared bus protocols are what the implementations offer (the detect worker relies on them
instead of probing attributes)."""

from __future__ import annotations

from kafka.future import Future

from fleethealth.bus import Bus, Consumer, InProcessBus, JsonlBus, PublishAck, RebalancingConsumer
from fleethealth.kafka_bus import KafkaBus, KafkaConsumerAdapter


def test_kafka_consumer_adapter_is_a_rebalancing_consumer():
    adapter = KafkaConsumerAdapter(object())
    assert isinstance(adapter, Consumer)
    assert isinstance(adapter, RebalancingConsumer)


def test_kafka_publish_future_is_a_publish_ack():
    fut = Future()
    assert isinstance(fut, PublishAck)
    assert not fut.is_done
    fut.success(None)
    assert fut.is_done and fut.succeeded()


def test_embedded_buses_are_plain_buses(tmp_path):
    mem = InProcessBus()
    assert isinstance(mem, Bus)
    c = mem.consumer(["t"], "g")
    assert isinstance(c, Consumer) and not isinstance(c, RebalancingConsumer)
    assert mem.publish("t", "h", b"x") is None  # durable once flush returns
    js = JsonlBus(tmp_path / "x.jsonl")
    assert isinstance(js, Bus)
    assert isinstance(KafkaBus.__new__(KafkaBus), Bus)
