"""The API's bodies as dataclasses, field for field as the coordinator's wire types
(`crates/api/src/lib.rs`, `service.rs`) name them.

Requests (`JobRequest`, `ServiceRequest`) keep `None` for a field not given: `to_dict()` sends
only the fields given, so the coordinator's defaults apply to the rest, as the CLI does. Money
on the wire: requests give dollars as decimal text ("2.5"); answers give integer micro-dollars in
fields ending `_micros` (`dollars()` turns them into a `Decimal`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Dict, List, Optional, Type, TypeVar, Union, get_args, get_origin, get_type_hints

W = TypeVar("W", bound="Wire")

#: A job's states once it has ended.
FINAL_STATES = ("finished", "failed", "cancelled")

#: Exit statuses of an ended job that did not finish, where it gave no code of its own
#: (docs/decisions.md, "A job's end as an exit status").
EXIT_FAILED = 1
EXIT_NEVER_PLACED = 69
EXIT_PREEMPTED = 75
EXIT_CANCELLED = 130


def dollars(micros: int) -> Decimal:
    """Micro-dollars (the API's `_micros` fields) as dollars."""
    return Decimal(micros).scaleb(-6)


def decimal_text(value: Union[str, int, float, Decimal]) -> str:
    """A number as decimal text without trailing zeros (the job files' normal form): 3.20 is
    "3.2", 8.0 is "8". Text is taken as written, less a leading `$`."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    if isinstance(value, str):
        text = value.strip()
        text = text[1:] if text.startswith("$") else text
    else:
        text = repr(value) if isinstance(value, float) else str(value)
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a number") from None
    if not number.is_finite():
        raise ValueError(f"{value!r} is not a finite number")
    if number == 0:
        return "0"
    return format(number.normalize(), "f")


_HINTS: Dict[type, Dict[str, Any]] = {}


def _hints(cls: type) -> Dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _wire_name(item: "dataclasses.Field[Any]") -> str:
    return str(item.metadata.get("wire", item.name))


def _decode(kind: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = get_origin(kind)
    if origin is Union:
        inner = [arg for arg in get_args(kind) if arg is not type(None)]
        return _decode(inner[0], value) if len(inner) == 1 else value
    if origin in (list, List):
        (item,) = get_args(kind)
        return [_decode(item, element) for element in value]
    if origin in (dict, Dict):
        _, item = get_args(kind)
        return {key: _decode(item, element) for key, element in value.items()}
    if isinstance(kind, type) and issubclass(kind, Wire):
        return kind.from_dict(value)
    return value


def _encode(value: Any, as_decimal: bool = False) -> Any:
    if isinstance(value, Wire):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_encode(element) for element in value]
    if isinstance(value, dict):
        return {key: _encode(element) for key, element in value.items()}
    if as_decimal and isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        return decimal_text(value)
    if isinstance(value, Decimal):
        return str(value)
    return value


class Wire:
    """What every body shares: `from_dict` from the API's JSON, `to_dict` back to it."""

    @classmethod
    def from_dict(cls: Type[W], data: Dict[str, Any], strict: bool = False) -> W:
        """The body from its JSON object. Fields the class does not know are ignored (a newer
        coordinator may add some), unless `strict`, which refuses them with a `ValueError`."""
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        hints = _hints(cls)
        by_wire = {_wire_name(item): item for item in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = [name for name in data if name not in by_wire]
        if strict and unknown:
            known = ", ".join(by_wire)
            raise ValueError(f"unknown field `{unknown[0]}` in {cls.__name__}; its fields are {known}")
        values = {item.name: _decode(hints[item.name], data[wire]) for wire, item in by_wire.items() if wire in data}
        return cls(**values)

    def to_dict(self) -> Dict[str, Any]:
        """The API's JSON object: the fields given (those not None)."""
        body: Dict[str, Any] = {}
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if value is not None:
                body[_wire_name(item)] = _encode(value, item.metadata.get("decimal", False))
        return body


# --------------------------------------------------------------------------------------------
# Requests


@dataclass
class DatasetRequest(Wire):
    """A dataset the agent fetches and checks before the job starts."""

    url: str
    #: "blake3:<64 hex>" or "sha256:<64 hex>".
    digest: str
    size_bytes: int


@dataclass
class ClientRequest(Wire):
    """Where the job's clients are, and the round-trip latency it needs to them."""

    latitude: float
    longitude: float
    latency_target_ms: int


@dataclass
class ServeSpec(Wire):
    """How a serving replica is reached through the gateway (`/s/{name}/…`)."""

    name: str
    port: Optional[int] = None
    health_path: Optional[str] = None
    version: Optional[int] = None


@dataclass
class JobRequest(Wire):
    """A job as submitted (`POST /v1/jobs`, `POST /v1/jobs/quote`). `None`: not given (the
    coordinator's default). A process job (`runtime="process"`) names its program in `image`
    and the program's arguments in `command`."""

    name: Optional[str] = None
    #: A container image, or with runtime "process" the program.
    image: Optional[str] = None
    command: Optional[List[str]] = None
    env: Optional[Dict[str, str]] = None
    #: Whole GPUs per replica (1–16); or `gpu_share_milli`, or `compute_units`, or none (CPU only).
    gpus: Optional[int] = None
    #: A share of one GPU, in thousandths (1–999).
    gpu_share_milli: Optional[int] = None
    #: Compute units per replica (1.0 = one H100 SXM), as decimal text ("2.5"); numbers are
    #: sent as such text.
    compute_units: Optional[Union[str, int, float, Decimal]] = field(default=None, metadata={"decimal": True})
    gpu_models: Optional[List[str]] = None
    gpu_memory_mib_min: Optional[int] = None
    cpu_milli: Optional[int] = None
    memory_mib: Optional[int] = None
    replicas: Optional[int] = None
    #: node, nvlink, fabric, site, region or any (default).
    topology: Optional[str] = None
    #: gold, silver or bronze.
    tier: Optional[str] = None
    #: training, inference, batch (default) or eval; `class` on the wire.
    class_: Optional[str] = field(default=None, metadata={"wire": "class"})
    #: The most paid per GPU-hour, in dollars, as decimal text ("2.5"); numbers are sent as such text.
    max_price_per_gpu_hour: Optional[Union[str, int, float, Decimal]] = field(default=None, metadata={"decimal": True})
    preemptible: Optional[bool] = None
    regions: Optional[List[str]] = None
    datasets: Optional[List[DatasetRequest]] = None
    client: Optional[ClientRequest] = None
    min_reliability: Optional[float] = None
    max_runtime_s: Optional[int] = None
    checkpoint_interval_s: Optional[int] = None
    checkpoint_dir: Optional[str] = None
    #: none (default) or bridge.
    network: Optional[str] = None
    #: An idempotency token: submitting again with it returns the first job.
    client_token: Optional[str] = None
    #: container or process; absent: whatever the node runs.
    runtime: Optional[str] = None
    #: restart (default) or keep.
    gang_repair: Optional[str] = None
    max_restarts: Optional[int] = None
    #: bill (default) or pause.
    repair_billing: Optional[str] = None
    serve: Optional[ServeSpec] = None
    #: An http(s) URL the agent PUTs each replica's `$FALLOW_OUTPUT_DIR` to as a tar archive
    #: when it ends; `{replica}` in it is replaced by the replica's number (without it, replica 0
    #: alone uses it). Without one the coordinator keeps the archive, up to 16 MiB.
    output_url: Optional[str] = None
    #: A reservation of the tenant's to run inside (booked ahead; whole GPUs only).
    reservation: Optional[int] = None


@dataclass
class ServiceRequest(Wire):
    """A service (`POST /v1/services`): replicas of `replica` behind the gateway at
    `/s/{name}/…`. `None`: not given (the coordinator's default)."""

    name: str
    replica: JobRequest
    port: Optional[int] = None
    health_path: Optional[str] = None
    min_replicas: Optional[int] = None
    max_replicas: Optional[int] = None
    burst_tier: Optional[str] = None
    target_in_flight: Optional[int] = None
    target_p95_ms: Optional[int] = None
    scale_up_after_s: Optional[int] = None
    scale_down_after_s: Optional[int] = None
    health_timeout_s: Optional[int] = None
    wake_timeout_s: Optional[int] = None


@dataclass
class ReservationRequest(Wire):
    """A booking ahead (`POST /v1/reservations`): whole GPUs of one model from a start for whole
    hours, at most `max_price_per_gpu_hour`; the whole price is held at booking
    (docs/reservations.md). `None`: not given (the coordinator's default)."""

    gpus: int
    #: A catalog name or alias, e.g. "H100".
    gpu_model: str
    #: µs since the Unix epoch; in the future, within a year.
    starts_at_us: int
    hours: int
    max_price_per_gpu_hour: Union[str, int, float, Decimal] = field(metadata={"decimal": True})
    regions: Optional[List[str]] = None
    #: node, nvlink, fabric, site, region or any (the default).
    topology: Optional[str] = None


# --------------------------------------------------------------------------------------------
# Answers


@dataclass
class OutputView(Wire):
    """A replica's output archive (a tar of its `$FALLOW_OUTPUT_DIR`)."""

    #: "blake3:<64 hex>" of the archive.
    digest: str = ""
    size_bytes: int = 0
    #: True when the coordinator keeps it (`Client.output`); false when it went to the job's
    #: `output_url` or its retention is over.
    kept: bool = False
    #: When the coordinator removed it at the end of its retention (µs); None while kept.
    expired_at_us: Optional[int] = None


@dataclass
class LeaseView(Wire):
    """One replica of a job bound to GPUs of one node."""

    id: int = 0
    job_id: int = 0
    replica: int = 0
    node_id: int = 0
    gpu_indices: List[int] = field(default_factory=list)
    #: Thousandths of each of those GPUs.
    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    epoch: int = 0
    #: pending, staging, running, finished, failed, preempted, …
    state: str = ""
    price_micros_per_gpu_hour: int = 0
    gpu_model: str = ""
    region: str = ""
    created_at_us: int = 0
    expected_end_us: int = 0
    preempt_at_us: Optional[int] = None
    ended_at_us: Optional[int] = None
    end_reason: str = ""
    #: The replica's exit code, when it ended by exiting and said so.
    exit_code: Optional[int] = None
    #: Its output archive, when it left one in `$FALLOW_OUTPUT_DIR`.
    output: Optional[OutputView] = None


@dataclass
class ProgressView(Wire):
    """What a job reports it has done, and its cost per million units so far."""

    unit: str = ""
    done: int = 0
    cost_micros_per_million_units: int = 0


@dataclass
class JobView(Wire):
    """A job as the coordinator knows it (`GET /v1/jobs/{id}`)."""

    id: int = 0
    tenant_id: int = 0
    #: queued, running, finished, failed or cancelled.
    state: str = ""
    state_reason: str = ""
    tier: str = ""
    submitted_at_us: int = 0
    updated_at_us: int = 0
    spec: JobRequest = field(default_factory=JobRequest)
    leases: List[LeaseView] = field(default_factory=list)
    cost_micros: int = 0
    escrow_micros: int = 0
    #: For a queued job: why no node can take it now.
    explanation: Optional[str] = None
    progress: Optional[ProgressView] = None
    #: 0 when it finished; when it failed, the code of the replica that failed first (None when
    #: none exited with one).
    exit_code: Optional[int] = None
    #: Where it was placed last: "own" (the tenant's own nodes, no market price), "market" or
    #: "reservation" (inside a booking); None before its first lease.
    capacity: Optional[str] = None

    @property
    def ended(self) -> bool:
        """Whether the job has ended (finished, failed or cancelled)."""
        return self.state in FINAL_STATES

    def exit_status(self) -> Optional[int]:
        """The job's end as a process's exit status, as `fallow job submit --wait` exits: 0 when
        it finished; the low byte of its exit code (1 where that byte is 0); 1 for a failure
        without a code; 69 when it was never placed; 75 when its last lease was preempted and it
        did not run again; 130 when it was cancelled. None while the job has not ended."""
        return exit_status(self)


def exit_status(job: JobView) -> Optional[int]:
    """See `JobView.exit_status`; the rules of `fallow job submit --wait` (`JobExit`)."""
    if job.state == "finished":
        return 0
    if job.state == "cancelled":
        return EXIT_CANCELLED
    if job.state not in FINAL_STATES:
        return None
    if job.exit_code is not None:
        # A shell's status is a byte; a code whose low byte is 0 still says "failed".
        low = job.exit_code & 0xFF
        return low if low != 0 else EXIT_FAILED
    if not job.leases:
        return EXIT_NEVER_PLACED
    never = 2**63
    last = max(job.leases, key=lambda lease: (never if lease.ended_at_us is None else lease.ended_at_us, lease.id))
    if last.state == "preempted":
        return EXIT_PREEMPTED
    return EXIT_FAILED


@dataclass
class JobList(Wire):
    """A page of jobs, newest first; `next_before` asks for the next (None on the last)."""

    jobs: List[JobView] = field(default_factory=list)
    next_before: Optional[int] = None


@dataclass
class LogChunk(Wire):
    """A piece of one replica's output (`LogChunkView`)."""

    id: int = 0
    lease_id: int = 0
    replica: int = 0
    byte_offset: int = 0
    text: str = ""
    at_us: int = 0


@dataclass
class JobLogs(Wire):
    """A page of a job's output, oldest first; ask again with `after=next_after` for more."""

    job_id: int = 0
    chunks: List[LogChunk] = field(default_factory=list)
    next_after: int = 0


@dataclass
class QuoteView(Wire):
    """What a job would clear at now (`POST /v1/jobs/quote`)."""

    #: None when no node can take it now.
    price_micros_per_gpu_hour: Optional[int] = None
    nodes_feasible: int = 0
    #: Of the nodes that fit, those already holding every dataset the job names; None when it
    #: names none.
    nodes_with_data: Optional[int] = None
    gpus_feasible: int = 0
    nodes_total: int = 0
    #: Why nodes were excluded, in words.
    explanation: str = ""
    #: For a tenant with nodes of its own: how many of them could take the job now, whatever
    #: their asks (it runs there at no price); None for a tenant with none.
    own_nodes_feasible: Optional[int] = None


@dataclass
class OfferView(Wire):
    """One node's offer in a search."""

    node_id: int = 0
    provider_id: int = 0
    gpu_model: str = ""
    gpu_count: int = 0
    gpus_free: int = 0
    gpu_memory_mib: int = 0
    compute_units: float = 0.0
    region: str = ""
    site: str = ""
    reliability: float = 0.0
    #: Per tier ("gold", "silver", "bronze").
    price_micros_per_gpu_hour: Dict[str, int] = field(default_factory=dict)
    online: bool = False
    simulated: bool = False


@dataclass
class OfferList(Wire):
    """Offers matching a filter (`GET /v1/offers`), cheapest first."""

    offers: List[OfferView] = field(default_factory=list)
    total_matching: int = 0
    #: When nothing matches: how many nodes each clause excluded.
    explanation: Optional[str] = None


@dataclass
class BalanceView(Wire):
    """An account's balances (`GET /v1/balance`), micro-dollars."""

    account_id: int = 0
    available_micros: int = 0
    escrow_micros: int = 0
    earnings_micros: int = 0
    bond_micros: int = 0


@dataclass
class ReservationNodeView(Wire):
    """A node's part of a booking, at the price fixed at booking."""

    node_id: int = 0
    gpus: int = 0
    price_micros_per_gpu_hour: int = 0
    held_from_us: int = 0
    held_until_us: int = 0
    #: When the node was lost to the booking (replaced, or its hours refunded).
    lost_at_us: Optional[int] = None


@dataclass
class ReservationView(Wire):
    """A booking as its tenant sees it (`GET /v1/reservations/{id}`), micro-dollars."""

    id: int = 0
    #: booked (before its start), active, ended or cancelled.
    state: str = ""
    state_reason: str = ""
    gpus: int = 0
    gpu_model: str = ""
    regions: List[str] = field(default_factory=list)
    topology: str = ""
    starts_at_us: int = 0
    ends_at_us: int = 0
    cost_micros: int = 0
    hold_micros: int = 0
    escrow_micros: int = 0
    #: What a cancellation now gives back.
    refund_if_cancelled_micros: int = 0
    nodes: List[ReservationNodeView] = field(default_factory=list)
    created_at_us: int = 0


@dataclass
class ReservationList(Wire):
    """A tenant's bookings (`GET /v1/reservations`), newest first."""

    reservations: List[ReservationView] = field(default_factory=list)


@dataclass
class OwnProviderView(Wire):
    """A provider account the tenant linked as its own (hybrid: its nodes run the tenant's jobs
    first, at no market price)."""

    provider_id: int = 0
    name: str = ""
    linked_at_us: int = 0
    #: Its nodes now, and their GPUs.
    nodes: int = 0
    gpus: int = 0


@dataclass
class OwnProviderList(Wire):
    """The tenant's own provider accounts (`GET /v1/own-providers`)."""

    providers: List[OwnProviderView] = field(default_factory=list)
