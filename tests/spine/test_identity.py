"""Per-host keys from one operator secret; a record verifies only with its own host's key."""

from __future__ import annotations

import os

import pytest

from fleethealth.bus import InProcessBus
from fleethealth.errors import UserError
from fleethealth.identity import HEADER, Verifier, host_key, read_key_file, sign

SECRET = bytes(range(32))


def test_a_record_verifies_only_with_the_key_of_the_host_it_names():
    v = Verifier(SECRET)
    value = b'{"host":"gpu-node-001"}'
    sig = sign(host_key(SECRET, "gpu-node-001"), "gpu-node-001", value)
    assert v.check("gpu-node-001", value, [(HEADER, sig)]) == ""
    assert "does not verify" in v.check("gpu-node-002", value, [(HEADER, sig)])  # another host's name
    assert "does not verify" in v.check("gpu-node-001", value + b" ", [(HEADER, sig)])  # altered value
    other = sign(host_key(SECRET, "gpu-node-002"), "gpu-node-001", value)  # 002's key, claiming 001
    assert "does not verify" in v.check("gpu-node-001", value, [(HEADER, other)])
    assert "no fh-sig header" in v.check("gpu-node-001", value, [])
    assert "without a key" in v.check(None, value, [(HEADER, sig)])
    assert v.rejected == 5
    assert host_key(SECRET, "a") != host_key(SECRET, "b") and host_key(SECRET, "a") != host_key(SECRET[::-1], "a")


def test_headers_travel_through_the_in_process_bus():
    bus = InProcessBus()
    c = bus.consumer(["t"], "g")
    bus.publish("t", "h1", b"v", ((HEADER, b"abc"),))
    (rec,) = c.poll(0)
    assert rec.headers == ((HEADER, b"abc"),)


def test_key_files_must_be_private_and_long_enough(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETHEALTH_ALLOW_OPEN_KEYS", raising=False)
    p = tmp_path / "secret"
    p.write_text(SECRET.hex() + "\n")
    os.chmod(p, 0o600)
    assert read_key_file(p) == SECRET
    os.chmod(p, 0o644)
    with pytest.raises(UserError, match="readable by others"):
        read_key_file(p)
    os.chmod(p, 0o600)
    p.write_text("abcd")
    with pytest.raises(UserError, match="at least 16"):
        read_key_file(p)
    with pytest.raises(UserError, match="secret"):
        read_key_file(tmp_path / "missing", "secret")
