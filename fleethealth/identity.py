"""Host identity: which host a telemetry record may speak for.

A Kafka consumer cannot see the principal that produced a record, so the broker's SASL/TLS
authentication alone cannot tell the detect worker that ``gpu-node-007``'s sample came from
gpu-node-007. The operator therefore provisions every host with its own key, derived from one
operator secret, and the collector signs each record with it:

    host key  = HMAC-SHA256(secret, "fleethealth host key v1\\0" + host)      (fleethealth identity-key HOST)
    signature = HMAC-SHA256(host key, host + "\\0" + value)                     (Kafka header ``fh-sig``, hex)

The detect worker holds only the secret (``detect --identity-secret FILE``), derives the key of the
host a record's key names, and rejects a record whose signature is missing or wrong, or whose key
does not name the sample's host (:class:`Verifier`). A host that learns its own key can speak only
for itself; replaying one of its old records is a duplicate or out-of-order sample (the engine's seq
and time checks). The secret and host keys are files of hex (or raw bytes), readable by their owner
only. Kafka ACLs then decide who may write each topic at all (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from fleethealth.errors import UserError

HEADER = "fh-sig"
_CONTEXT = b"fleethealth host key v1\0"
MIN_SECRET_BYTES = 16


def host_key(secret: bytes, host: str) -> bytes:
    """The key one host signs its records with (32 bytes)."""
    return hmac.new(secret, _CONTEXT + host.encode(), hashlib.sha256).digest()


def sign(key: bytes, host: str, value: bytes) -> bytes:
    """The ``fh-sig`` header value of one record (hex)."""
    mac = hmac.new(key, host.encode() + b"\0", hashlib.sha256)
    mac.update(value)  # no copy of the value
    return mac.hexdigest().encode()


def read_key_file(path: str | Path, what: str = "key") -> bytes:
    """A secret or host key from a file: hex text (what ``identity-key`` prints) or raw bytes.
    Refuses a file others can read, and one too short to be a secret."""
    p = Path(path)
    try:
        st = p.stat()
        data = p.read_bytes()
    except OSError as exc:
        raise UserError(f"{what} file {p}: {exc.strerror or exc}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO) and not os.environ.get("FLEETHEALTH_ALLOW_OPEN_KEYS"):
        raise UserError(f"{what} file {p} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it")
    text = data.strip()
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = data
    if len(key) < MIN_SECRET_BYTES:
        raise UserError(f"{what} file {p}: {len(key)} bytes; at least {MIN_SECRET_BYTES} are needed")
    return key


def header(headers: Iterable[tuple[str, bytes]] | None) -> bytes | None:
    for k, v in headers or ():
        if k == HEADER:
            return v
    return None


class Verifier:
    """Checks one record against the operator secret: ``check(key, value, headers)`` returns ""
    when the record is signed by the key's host, else the reason to reject it."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise UserError(f"identity secret of {len(secret)} bytes; at least {MIN_SECRET_BYTES} are needed")
        self._secret = secret
        self.rejected = 0

    def check(self, key: str | None, value: bytes, headers: Iterable[tuple[str, bytes]] | None) -> str:
        if not key:
            why = "unsigned identity: a record without a key cannot name the host it speaks for"
        else:
            got = header(headers)
            if got is None:
                why = f"no {HEADER} header: the record is not signed by {key!r}'s host key"
            elif not hmac.compare_digest(got, sign(host_key(self._secret, key), key, value)):
                why = f"{HEADER} does not verify with {key!r}'s host key: not sent by that host"
            else:
                return ""
        self.rejected += 1
        return why
