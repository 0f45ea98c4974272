"""The message contracts: telemetry sample, incident, action, dead letter.

Versioned msgspec structs with a strict decoder. Field meanings, units and sources are documented
in ``docs/telemetry.md``. Counters are sent raw, as read; ``None`` means "not available on this
device or driver" (a vGPU guest, an old driver), which is different from 0.

Decoding never raises a bare traceback: :func:`decode_sample`, :func:`decode_incident` and
:func:`decode_action` raise :class:`ContractError` whose message names the offending field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

SCHEMA_VERSION: Final = 1
# Additive revisions inside version 1 (new optional fields; a rev-N reader reads every rev < N).
# rev 2: GpuSample.field_errors and .mig_enabled, EccCounters.total_*, NvlinkCounters.ecc_data and
# the NVLink5 field counters (symbol_errors, effective_errors, recovery_events). Consumers decode
# with forbid_unknown_fields, so they are upgraded before the collectors (docs/telemetry.md).
# rev 3: GpuSample.thermal (driver thresholds, memory temperature), .ecc_mode_current/_pending, .brand,
# EccCounters SRAM by kind and unit, RemappedRows' remapper histogram, XidEvent MIG instance ids,
# PcieLink.slot_* / AerDevice.upstream_* (the upstream port's link capability from sysfs).
SCHEMA_REVISION: Final = 3
MAX_MESSAGE_BYTES: Final = 1 << 20  # 1 MiB: a real 8-GPU sample is ~6 KiB
MAX_GPUS: Final = 64
MAX_PORTS: Final = 64
MAX_EVENTS: Final = 4096

# msgspec cannot bound an int past int64 (its ``le`` must fit one), so a JSON integer past 2**64-1
# (thousands of digits are legal JSON) is caught by :func:`decode_sample`'s digit-run check instead;
# msgpack cannot carry one at all.
U64 = Annotated[int, Meta(ge=0)]
U64_MAX: Final = (1 << 64) - 1
PID_MAX: Final = 1 << 22  # Linux PID_MAX_LIMIT: no process id is larger
Pid = Annotated[int, Meta(ge=0, le=PID_MAX)]
Count = U64 | None
Small = Annotated[int, Meta(ge=0, le=1_000_000)]
Name = Annotated[str, Meta(max_length=256)]
Text = Annotated[str, Meta(max_length=8192)]
Ts = Annotated[float, Meta(ge=0.0, le=1e11)]  # unix seconds
Gauge = Annotated[float, Meta(ge=-1e6, le=1e7)] | None


class _Base(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    pass


# --------------------------------------------------------------------------- telemetry sample


class EccCounters(_Base, kw_only=True):
    """NVML ECC counters by location. volatile = since driver load; aggregate = lifetime (inforom)."""

    dram_corrected_volatile: Count = None
    dram_uncorrected_volatile: Count = None
    sram_corrected_volatile: Count = None
    sram_uncorrected_volatile: Count = None
    dram_corrected_aggregate: Count = None
    dram_uncorrected_aggregate: Count = None
    sram_corrected_aggregate: Count = None
    sram_uncorrected_aggregate: Count = None
    sram_threshold_exceeded: bool | None = None  # NVML aggregate-extended SRAM threshold flag
    # rev 2: nvmlDeviceGetTotalEccErrors (all memory systems summed), read only where the GPU has
    # no per-location counters; kept apart so SRAM errors never read as DRAM ones
    total_corrected_volatile: Count = None
    total_uncorrected_volatile: Count = None
    total_corrected_aggregate: Count = None
    total_uncorrected_aggregate: Count = None
    # rev 3: nvmlDeviceGetSramEccErrorStatus by kind (parity vs SEC-DED) and, aggregate, by unit
    sram_uncorrected_parity_volatile: Count = None
    sram_uncorrected_secded_volatile: Count = None
    sram_uncorrected_parity_aggregate: Count = None
    sram_uncorrected_secded_aggregate: Count = None
    sram_uncorrected_l2_aggregate: Count = None
    sram_uncorrected_sm_aggregate: Count = None
    sram_uncorrected_pcie_aggregate: Count = None
    sram_uncorrected_mcu_aggregate: Count = None
    sram_uncorrected_other_aggregate: Count = None


class RemappedRows(_Base, kw_only=True):
    correctable: Count = None
    uncorrectable: Count = None
    pending: bool | None = None
    failure: bool | None = None
    # rev 3: nvmlDeviceGetRowRemapperHistogram: banks by spare-row availability (max = every
    # reserved row free ... none = no reserved row left: the next remap in such a bank fails)
    hist_max: Count = None
    hist_high: Count = None
    hist_partial: Count = None
    hist_low: Count = None
    hist_none: Count = None


class RetiredPages(_Base, kw_only=True):
    """Pre-Ampere dynamic page retirement."""

    sbe: Count = None
    dbe: Count = None
    pending: bool | None = None


class PcieLink(_Base, kw_only=True):
    gen_current: Small | None = None
    gen_max: Small | None = None
    width_current: Small | None = None
    width_max: Small | None = None
    replay_counter: Count = None
    replay_rollover: Count = None
    # rev 3: the upstream port's (the slot's) link capability, from sysfs max_link_width /
    # max_link_speed of the GPU function's parent bridge: a link narrower than the GPU's max but
    # as wide as the slot allows is slot-limited, not degraded
    slot_width_max: Small | None = None
    slot_gen_max: Small | None = None


class NvlinkCounters(_Base, kw_only=True):
    """Per-link NVLink error counters, one list entry per link index (struct of arrays: a GPU has
    up to 18 links, and one object per link would triple decode time)."""

    active: Annotated[list[bool | None], Meta(max_length=32)] = []
    crc_flit: Annotated[list[Count], Meta(max_length=32)] = []
    crc_data: Annotated[list[Count], Meta(max_length=32)] = []
    replay: Annotated[list[Count], Meta(max_length=32)] = []
    recovery: Annotated[list[Count], Meta(max_length=32)] = []
    # rev 2. Hopper+: the data-path counter is ECC_DATA (CRC_DATA is not supported there)
    ecc_data: Annotated[list[Count], Meta(max_length=32)] = []
    # rev 2. Blackwell (NVLink5) per-link field values (NVML_FI_DEV_NVLINK_COUNT_*, scopeId = link)
    symbol_errors: Annotated[list[Count], Meta(max_length=32)] = []
    effective_errors: Annotated[list[Count], Meta(max_length=32)] = []
    recovery_events: Annotated[list[Count], Meta(max_length=32)] = []


class XidEvent(_Base, kw_only=True):
    xid: Small
    ts: Ts
    pid: Pid | None = None
    message: Text = ""
    # rev 3: the MIG instance the event belongs to (nvmlEventData gpuInstanceId / computeInstanceId);
    # None when the GPU is not in MIG mode or the event is GPU-wide (0xFFFFFFFF)
    gpu_instance: Small | None = None
    compute_instance: Small | None = None


class GpuThermal(_Base, kw_only=True):
    """rev 3: the driver's own temperature limits for this board, and its memory temperature."""

    memory_c: Gauge = None  # field value NVML_FI_DEV_MEMORY_TEMP (82): HBM temperature
    slowdown_c: Gauge = None  # nvmlDeviceGetTemperatureThreshold(SLOWDOWN): the driver slows clocks
    shutdown_c: Gauge = None  # ... (SHUTDOWN): the board powers off
    gpu_max_c: Gauge = None  # ... (GPU_MAX): max operating temperature of the GPU
    mem_max_c: Gauge = None  # ... (MEM_MAX): max operating temperature of the memory


class GpuSample(_Base, kw_only=True):
    index: Small
    uuid: Name = ""
    pci_bus_id: Name = ""
    name: Name = ""
    present: bool = True
    nvml_error: Name | None = None  # e.g. "GPU_IS_LOST", "TIMEOUT" (a hung call)
    ecc: EccCounters | None = None
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None
    pcie: PcieLink | None = None
    nvlink: NvlinkCounters | None = None
    temperature_c: Gauge = None
    power_w: Gauge = None
    utilization_pct: Gauge = None
    clocks_event_reasons: U64 | None = None  # NVML clocks-event (throttle) reason bitmask
    # rev 2: MIG mode (volatile ECC, remapped rows and utilisation are not readable per device under MIG)
    mig_enabled: bool | None = None
    # rev 2: field group -> NVML error name, for reads that failed with an error that does not mean
    # "not available" (e.g. {"remapped_rows": "CORRUPTED_INFOROM", "ecc": "UNKNOWN"}); the field is
    # then None *and* listed here. NotSupported / FunctionNotFound / NoPermission are never listed.
    field_errors: Annotated[dict[Name, Name], Meta(max_length=64)] = {}
    # rev 3
    thermal: GpuThermal | None = None
    ecc_mode_current: bool | None = None  # nvmlDeviceGetEccMode: ECC on now
    ecc_mode_pending: bool | None = None  # ... after the next reboot / GPU reset
    brand: Name | None = None  # nvmlDeviceGetBrand as nvidia-smi spells it ("NVIDIA", "Tesla", "GeForce", ...)
    xids: Annotated[list[XidEvent], Meta(max_length=MAX_EVENTS)] = []


class NetPort(_Base, kw_only=True):
    """An InfiniBand or RoCE port from /sys/class/infiniband/<dev>/ports/<n>."""

    device: Name
    port: Small
    link_layer: Name = "InfiniBand"  # or "Ethernet" (RoCE)
    state: Name = ""  # e.g. "ACTIVE", "DOWN" (the text after "4: ")
    phys_state: Name = ""  # e.g. "LinkUp", "Polling", "Disabled"
    rate_gbps: Gauge = None
    counters: dict[Name, U64] = {}  # counters/ and hw_counters/ files, raw


class AerDevice(_Base, kw_only=True):
    """PCIe AER counters from /sys/bus/pci/devices/<addr>/aer_dev_{correctable,fatal,nonfatal}."""

    pci_addr: Name
    correctable: dict[Name, U64] = {}
    fatal: dict[Name, U64] = {}
    nonfatal: dict[Name, U64] = {}
    link_gen_current: Small | None = None
    link_gen_max: Small | None = None
    link_width_current: Small | None = None
    link_width_max: Small | None = None
    # rev 3: the parent bridge's (upstream port's) address and link capability
    upstream: Name | None = None
    upstream_width_max: Small | None = None
    upstream_gen_max: Small | None = None


class EdacDimm(_Base, kw_only=True):
    label: Name
    ce: Count = None
    ue: Count = None


class EdacMc(_Base, kw_only=True):
    """One EDAC memory controller from /sys/devices/system/edac/mc/mcN."""

    mc: Small
    ce_count: Count = None
    ue_count: Count = None
    ce_noinfo_count: Count = None
    ue_noinfo_count: Count = None
    dimms: Annotated[list[EdacDimm], Meta(max_length=256)] = []


KernelEventKind = Literal["xid", "fell_off_bus", "aer", "mce", "edac", "other"]


class KernelEvent(_Base, kw_only=True):
    ts: Ts
    kind: KernelEventKind
    line: Text
    pci_addr: Name | None = None
    xid: Small | None = None
    severity: Name | None = None  # e.g. "corrected", "uncorrected", "fatal", "non-fatal"
    pid: Pid | None = None  # NVRM Xid lines: the process the driver named, when known
    message: Text = ""  # the message after the Xid / device prefix (``line`` keeps the raw text)


class SourceError(_Base, kw_only=True):
    source: Name
    error: Text


class Sample(_Base, kw_only=True):
    """One poll of one host: the message on ``fleet.telemetry.v1`` (key = host)."""

    v: Literal[1] = 1
    host: Annotated[str, Meta(min_length=1, max_length=253)]
    cluster: Name = "default"
    rack: Name = ""
    ts: Ts
    seq: U64
    collector_version: Name
    boot_id: Name = ""  # changes on reboot: counters restart
    driver_version: Name = ""
    expected_gpus: Annotated[int, Meta(ge=0, le=MAX_GPUS)] = 0
    gpus: Annotated[list[GpuSample], Meta(max_length=MAX_GPUS)] = []
    net_ports: Annotated[list[NetPort], Meta(max_length=MAX_PORTS)] = []
    aer: Annotated[list[AerDevice], Meta(max_length=256)] = []
    edac: Annotated[list[EdacMc], Meta(max_length=64)] = []
    kernel_events: Annotated[list[KernelEvent], Meta(max_length=MAX_EVENTS)] = []
    source_errors: Annotated[list[SourceError], Meta(max_length=64)] = []


class SampleEnvelope(msgspec.Struct, kw_only=True):
    """A sample's envelope, checked as :class:`Sample` checks it; the rest of the message is parsed
    (it must be well-formed) but not validated: what a producer that only forwards samples needs
    (``replay``: key, pacing, lines that are not samples), at a fifth of the strict decode's cost.
    The detect worker decodes every sample strictly."""

    v: Literal[1] = 1
    host: Annotated[str, Meta(min_length=1, max_length=253)]
    ts: Ts
    seq: U64
    collector_version: Name


# --------------------------------------------------------------------------- incident / action

IncidentState = Literal["open", "updated", "resolved"]
SeverityName = Literal["critical", "major", "minor", "info"]


class Evidence(_Base, kw_only=True):
    fact: Text
    ts: Ts | None = None
    line: Text = ""  # the raw log line or tool output that justifies the fact, when there is one


class Incident(_Base, kw_only=True):
    """An episode of one failure mode on one component (``fleet.incidents.v1``, key = host)."""

    v: Literal[1] = 1
    id: Name  # stable: same (host, component, failure_mode, episode) -> same id
    host: Annotated[str, Meta(min_length=1, max_length=253)]
    cluster: Name = "default"
    rack: Name = ""
    component: Name  # GPU UUID, port "mlx5_0/1", DIMM label, PCI address, or "host"
    failure_mode: Name  # validated against the vocabulary by decode_incident
    severity: SeverityName
    confidence: Annotated[float, Meta(ge=0.0, le=1.0)]
    detector: Name  # rule id, or "model:<name>@<version>"
    first_seen: Ts
    last_seen: Ts
    state: IncidentState
    evidence: Annotated[list[Evidence], Meta(max_length=256)] = []
    recommended_action: list[Name] = []
    xid: Small | None = None
    nvidia_bucket: Name | None = None
    update_seq: U64 = 0  # bumps on every update of the episode


ActionKind = Literal[
    "drain", "resume", "reset_gpu", "reboot_request", "ticket_opened", "ticket_updated",
    "suppressed", "queued", "dry_run", "alert", "annotate", "noop",
]
ActionOutcome = Literal["done", "refused", "queued", "dry_run", "failed", "skipped"]


class ActionRecord(_Base, kw_only=True):
    """What remediation did or refused to do, and why (``fleet.actions.v1`` + audit table)."""

    v: Literal[1] = 1
    id: Name  # idempotency key: (incident id, kind, target)
    incident_id: Name
    host: Name
    component: Name = ""
    failure_mode: Name = ""
    kind: ActionKind
    outcome: ActionOutcome
    reason: Text = ""
    ts: Ts
    actor: Name = "fleethealth"
    details: dict[Name, Text] = {}


class DeadLetter(_Base, kw_only=True):
    """A message a consumer could not decode, with the reason (``fleet.deadletter.v1``)."""

    v: Literal[1] = 1
    source_topic: Name
    partition: int | None = None
    offset: int | None = None
    key: Text | None = None
    reason: Text
    consumer: Name = ""
    ts: Ts
    payload_excerpt: Text = ""  # first bytes of the payload, as repr text
    payload_size: int = 0


# --------------------------------------------------------------------------- codec


class ContractError(ValueError):
    """A message that breaks the contract. ``field`` is a JSON path like ``$.gpus[0].ecc``."""

    def __init__(self, kind: str, reason: str, field: str = "$", *, invalid_value: bool = False) -> None:
        super().__init__(f"{kind}: {reason}" + (f" (at {field})" if field else ""))
        self.kind = kind
        self.reason = reason
        self.field = field
        self.invalid_value = invalid_value  # a value broke its type or range (the rest parsed)


_AT = re.compile(r" - at `([^`]*)`$")


class _Envelope(Struct):
    v: Any = None


_envelope = msgspec.json.Decoder(_Envelope)
_envelope_mp = msgspec.msgpack.Decoder(_Envelope)
_encoder = msgspec.json.Encoder()
_mp_encoder = msgspec.msgpack.Encoder()
T = TypeVar("T", bound=Struct)


class _Codec:
    """A strict decoder for one message type."""

    def __init__(self, kind: str, typ: type[T]) -> None:
        self.kind = kind
        self.typ = typ
        self._dec = msgspec.json.Decoder(typ)
        self._mp = msgspec.msgpack.Decoder(typ)

    def decode(self, data: bytes | bytearray | memoryview | str) -> Any:
        if isinstance(data, str):
            data = data.encode()
        if len(data) > MAX_MESSAGE_BYTES:
            raise ContractError(self.kind, f"message of {len(data)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
        # JSON is the default wire format; a msgpack map (first byte 0x80-0x8f, 0xde, 0xdf) is the
        # compact one (half the decode time), chosen per producer. Both carry the same structs.
        packed = len(data) > 0 and (0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF))
        try:
            return self._mp.decode(data) if packed else self._dec.decode(data)
        except msgspec.ValidationError as exc:
            self._raise_version(data, packed)
            msg = str(exc)
            m = _AT.search(msg)
            raise ContractError(self.kind, msg[: m.start()] if m else msg, m.group(1) if m else "$",
                                invalid_value=True) from None
        except msgspec.DecodeError as exc:
            raise ContractError(self.kind, f"not valid {'msgpack' if packed else 'JSON'}: {exc}") from None
        except RecursionError:
            raise ContractError(self.kind, "nested too deeply to be a contract message") from None

    def _raise_version(self, data: bytes | bytearray | memoryview, packed: bool = False) -> None:
        try:
            v = (_envelope_mp if packed else _envelope).decode(data).v
        except (msgspec.MsgspecError, RecursionError):
            return
        if v is not None and v != SCHEMA_VERSION:
            raise ContractError(
                self.kind, f"unsupported schema version {v!r}; this build reads version {SCHEMA_VERSION}", "$.v"
            )


SAMPLE = _Codec("telemetry sample", Sample)
ENVELOPE = _Codec("telemetry sample", SampleEnvelope)
INCIDENT = _Codec("incident", Incident)
ACTION = _Codec("action", ActionRecord)
DEADLETTER = _Codec("dead letter", DeadLetter)


def encode(msg: _Base) -> bytes:
    """JSON, the default wire and file format."""
    return _encoder.encode(msg)


def encode_packed(msg: _Base) -> bytes:
    """msgpack: the compact wire format for Kafka at fleet scale; every decoder here reads both."""
    return _mp_encoder.encode(msg)


def is_packed(data: bytes | bytearray | memoryview) -> bool:
    """Whether a message is msgpack (a map: first byte 0x80-0x8f, 0xde or 0xdf) rather than JSON,
    as every decoder here tells them apart: by the bytes, never by a header's claim."""
    return len(data) > 0 and (0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF))


def as_json(data: bytes) -> bytes:
    """A message as JSON: msgpack transcoded value for value (no schema check: a bad field stays
    bad, for the consumer that decodes it strictly; binary becomes base64 text, integer keys
    strings), JSON unchanged. Raises ContractError when the msgpack does not decode."""
    if not is_packed(data):
        return data
    try:
        return _encoder.encode(msgspec.msgpack.decode(data))
    except (msgspec.MsgspecError, TypeError, ValueError, RecursionError) as exc:
        raise ContractError("message", f"msgpack that cannot be written as JSON: {exc}") from None


def decode_sample(data: bytes | str) -> Sample:
    """A telemetry sample, strictly. A value out of its type or range (an integer past 2**64-1, a
    NaN gauge, a pid past PID_MAX, a negative counter) costs that field, not the sample: see
    :mod:`fleethealth.salvage`; what was removed is named in ``source_errors`` (source
    ``contract``). Anything else that breaks the contract raises :class:`ContractError`."""
    from fleethealth.salvage import has_long_digits, salvage

    if isinstance(data, str):
        data = data.encode()
    try:
        s: Sample = SAMPLE.decode(data)
    except ContractError as exc:
        if not exc.invalid_value:
            raise
        return salvage(data, exc)
    if not (0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF)) and has_long_digits(data):  # JSON only
        return salvage(data, None)
    return s


def decode_envelope(data: bytes | str) -> SampleEnvelope:
    """A sample's envelope (host, ts, seq, version) strictly; the rest only well-formed."""
    env: SampleEnvelope = ENVELOPE.decode(data)
    return env


def decode_incident(data: bytes | str) -> Incident:
    from fleethealth.taxonomy import ALL_LABELS

    inc: Incident = INCIDENT.decode(data)
    if inc.failure_mode not in ALL_LABELS:
        raise ContractError("incident", f"unknown failure mode {inc.failure_mode!r}", "$.failure_mode")
    if inc.last_seen < inc.first_seen:
        raise ContractError("incident", "last_seen is before first_seen", "$.last_seen")
    return inc


def decode_action(data: bytes | str) -> ActionRecord:
    return ACTION.decode(data)  # type: ignore[no-any-return]


def to_builtins(msg: _Base) -> Any:
    return msgspec.to_builtins(msg)


def convert(obj: Any, typ: type[T], kind: str = "message") -> T:
    """Build a struct from Python builtins (e.g. YAML), with the same field-naming errors."""
    try:
        return msgspec.convert(obj, typ)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        m = _AT.search(msg)
        raise ContractError(kind, msg[: m.start()] if m else msg, m.group(1) if m else "$") from None
