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


def test_confluent_bus_consumer_and_ack_are_the_same_protocols():
    from fleethealth.kafka_confluent import ConfluentAck, ConfluentBus, ConfluentConsumer

    assert isinstance(ConfluentBus.__new__(ConfluentBus), Bus)
    c = ConfluentConsumer(object(), ConfluentBus.__new__(ConfluentBus))
    assert isinstance(c, Consumer) and isinstance(c, RebalancingConsumer)
    ack = ConfluentAck()
    assert isinstance(ack, PublishAck) and not ack.is_done and not ack.succeeded()
    ack(None, None)  # librdkafka's delivery report: (error, message)
    assert ack.is_done and ack.succeeded()
    failed = ConfluentAck()
    failed("broker said no", None)
    assert failed.is_done and not failed.succeeded()


def test_kafka_security_settings_map_to_librdkafka_names():
    import pytest

    from fleethealth.bus import BusError
    from fleethealth.kafka_confluent import rdkafka_security

    got = rdkafka_security({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                            "sasl_plain_username": "det", "sasl_plain_password": "pw", "ssl_cafile": "/ca.pem",
                            "ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem", "ssl_check_hostname": False})
    assert got == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "det",
                   "sasl.password": "pw", "ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/c.pem",
                   "ssl.key.location": "/k.pem", "ssl.endpoint.identification.algorithm": "none"}
    with pytest.raises(BusError, match="unknown Kafka security option"):
        rdkafka_security({"sasl_username": "x"})
    with pytest.raises(BusError, match="kafka-python"):
        rdkafka_security({"sasl_oauth_token_provider": object()})


def test_kafka_client_is_chosen_by_flag_then_config_then_default():
    import pytest

    from fleethealth.config import DEFAULT_KAFKA_CLIENT, Config, ConfigError, kafka_bus, kafka_client
    from fleethealth.kafka_confluent import ConfluentBus

    cfg = Config({"kafka": {"client": "kafka-python"}}, None)
    assert kafka_client(None) == DEFAULT_KAFKA_CLIENT
    assert kafka_client(None, cfg) == "kafka-python"
    assert kafka_client("confluent", cfg) == "confluent"
    with pytest.raises(ConfigError, match="use one of"):
        kafka_client(None, Config({"kafka": {"client": "librdkafka"}}, None))
    assert isinstance(kafka_bus("127.0.0.1:1", "confluent"), ConfluentBus)  # nothing connects until used
    assert isinstance(kafka_bus("127.0.0.1:1", "kafka-python"), KafkaBus)


def test_without_confluent_kafka_the_default_falls_back_and_an_explicit_choice_is_an_error(monkeypatch):
    import sys

    import pytest

    from fleethealth.config import Config, ConfigError, kafka_bus

    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # import confluent_kafka -> ImportError
    assert isinstance(kafka_bus("127.0.0.1:1"), KafkaBus)  # an environment installed before the dependency
    with pytest.raises(ConfigError, match="not installed"):
        kafka_bus("127.0.0.1:1", "confluent")
    with pytest.raises(ConfigError, match="not installed"):
        kafka_bus("127.0.0.1:1", None, Config({"kafka": {"client": "confluent"}}, None))


def test_kafka_wire_is_chosen_by_flag_then_config_then_default_msgpack():
    import pytest

    from fleethealth.config import DEFAULT_KAFKA_WIRE, Config, ConfigError, kafka_wire

    assert kafka_wire(None) == DEFAULT_KAFKA_WIRE == "msgpack"
    assert kafka_wire(None, Config({"kafka": {"wire": "json"}}, None)) == "json"
    assert kafka_wire("msgpack", Config({"kafka": {"wire": "json"}}, None)) == "msgpack"
    with pytest.raises(ConfigError, match=r"\[kafka\].wire 'avro': use one of msgpack, json"):
        kafka_wire(None, Config({"kafka": {"wire": "avro"}}, None))
