"""Job files (docs/job-files.md): the YAML a person writes, close to SkyPilot's task file, read
into the API's `JobRequest`, or with a `service` section a `ServiceRequest`.

The same file gives the same request as `fallow job submit FILE` (the normal forms of
docs/job-files.md): every key is checked before anything is sent, and every fault names the
file, line and column (1-based) of the offending key or value. Scalars are read from their text
as written (`3.0` stays "3.0", `yes` stays "yes"), with YAML 1.2's core schema deciding what a
plain scalar is (only `true` and `false` are booleans).
"""

from __future__ import annotations

import json
import math
import os
import re
from decimal import Decimal
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import JobFileError
from .types import JobRequest, ServiceRequest

PathLike = Union[str, "os.PathLike[str]"]

#: The largest job file read: the API's largest request body.
JOB_FILE_BYTES_MAX = 256 * 1024

#: The API's bounds the file's values are checked against.
REPLICAS_MAX = 4096
GPUS_PER_REPLICA_MAX = 16
REGIONS_MAX = 32
RUNTIME_S_MAX = 30 * 24 * 3600
PRICE_MICROS_MAX = 1_000 * 1_000_000
COMPUTE_UNITS_MICROS_MAX = 64 * 1_000_000
MEMORY_MIB_MAX = 1 << 40
U32_MAX = 2**32 - 1
SERVICE_REPLICAS_MAX = 64
#: The largest id the server keeps (a signed 64-bit integer).
ID_MAX = 2**63 - 1
SERVICE_SECONDS_MAX = 86_400

TIERS = ("gold", "silver", "bronze")
CLASSES = ("training", "inference", "batch", "eval")
TOPOLOGIES = ("node", "nvlink", "fabric", "site", "region", "any")
RUNTIMES = ("container", "process")
NETWORKS = ("none", "bridge")
GANG_REPAIRS = ("restart", "keep")
REPAIR_BILLINGS = ("bill", "pause")

TOP_KEYS = (
    "name", "resources", "num_nodes", "tier", "max_price", "preemptible", "class", "max_runtime", "envs",
    "setup", "run", "command", "runtime", "datasets", "checkpoint", "gang", "network", "client_token", "output_url",
    "reservation", "service",
)  # fmt: skip
RESOURCE_KEYS = (
    "accelerators", "compute_units", "cpus", "memory", "gpu_memory", "image_id", "ports", "regions", "topology",
    "min_reliability",
)  # fmt: skip
CHECKPOINT_KEYS = ("dir", "interval")
GANG_KEYS = ("repair", "max_restarts", "repair_billing")
DATASET_KEYS = ("url", "digest", "size")
SERVICE_KEYS = ("name", "readiness_probe", "replicas", "replica_policy", "wake_timeout")
PROBE_KEYS = ("path", "initial_delay_seconds")
POLICY_KEYS = (
    "min_replicas", "max_replicas", "target_in_flight", "target_p95_ms", "burst_tier", "upscale_delay_seconds",
    "downscale_delay_seconds",
)  # fmt: skip

_DATASETS_HINT = (
    "Fallow stages `datasets` instead: each a `url`, a `digest` (blake3:<64 hex> or sha256:<64 hex>) and a "
    "`size`, fetched and checked into $FALLOW_DATASETS_DIR before the job starts"
)

#: Keys of other task files (SkyPilot's) and Fallow's form of each.
HINTS: Dict[str, str] = {
    "use_spot": "Fallow's form is `tier: bronze` (interruptible) at the top level",
    "spot_recovery": "Fallow's form is `tier: bronze` (interruptible) at the top level",
    "job_recovery": (
        "a preempted job queues again by itself, and a gang restarts in place (`gang: {max_restarts: N}`); "
        "keep its state with `checkpoint: {dir: …}`"
    ),
    "region": "Fallow's form is `regions: [REGION, …]` in resources",
    "zone": "Fallow's form is `regions: [REGION, …]` in resources",
    "cloud": "Fallow is one market, not a choice of clouds: narrow it with `regions: [REGION, …]` in resources",
    "infra": "Fallow is one market, not a choice of clouds: narrow it with `regions: [REGION, …]` in resources",
    "file_mounts": _DATASETS_HINT,
    "storage_mounts": _DATASETS_HINT,
    "workdir": "nothing is uploaded: put the code in the image (`image_id` in resources), or fetch it in `setup`",
    "instance_type": "give `accelerators`, `cpus` and `memory` in resources",
    "disk_size": "a replica's disk is not sold on its own",
    "disk_tier": "a replica's disk is not sold on its own",
    "any_of": "list the alternatives in `accelerators`: `{H100: 8, H200: 8}` or `[H100:8, H200:8]`",
    "ordered": "list the alternatives in `accelerators`: `{H100: 8, H200: 8}` or `[H100:8, H200:8]`",
    "image": "Fallow's form is `image_id` in resources",
    "env": "Fallow's form is `envs`",
    "secrets": "Fallow's form is `envs`",
    "gpus": "Fallow's form is `accelerators: MODEL:COUNT` (or a count alone) in resources",
    "max_price_per_gpu_hour": "Fallow's form is `max_price`",
    "port": "Fallow's form is `ports` in resources",
    "target_qps_per_replica": (
        "Fallow scales on requests in flight per ready replica (`target_in_flight`) and on p95 latency "
        "(`target_p95_ms`) in service.replica_policy"
    ),
    "base_ondemand_fallback_replicas": (
        "Fallow's form is `burst_tier` in service.replica_policy: replicas above the minimum run on that tier"
    ),
    "dynamic_ondemand_fallback": (
        "Fallow's form is `burst_tier` in service.replica_policy: replicas above the minimum run on that tier"
    ),
}

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.nan|\.NaN|\.NAN)$"
)
_AMOUNT = re.compile(r"^(?P<whole>[0-9]*)(?:\.(?P<fraction>[0-9]*))?$")
_SIZE = re.compile(r"^(?P<number>[0-9]*(?:\.[0-9]*)?)\s*(?P<unit>[A-Za-z]*)$")
_DURATION = re.compile(r"^(?:[0-9]+[smhd])+$")
_DURATION_PART = re.compile(r"([0-9]+)([smhd])")
_DIGEST = re.compile(r"^(?:blake3|sha256):[0-9a-fA-F]{64}$")

_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
}
_SIZE_UNITS_TEXT = "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_COUNT_RULE = (
    "a whole number of GPUs 1–16 (one node's), or a share of one GPU below 1 (e.g. 0.25) with at most three decimals"
)


# --------------------------------------------------------------------------------------------
# The public functions


def load_job_file(path: PathLike, **overrides: Any) -> JobRequest:
    """The `JobRequest` a job file makes (YAML as docs/job-files.md says, or the API's JSON).

    `overrides` are JobRequest fields that win over the file's, as flags do beside a file on the
    command line (`tier="silver"`; `env` adds to the file's `envs`). What neither gives (`tier`,
    `max_price`, an image) stays out of the request, and the coordinator refuses it. A file with a
    `service` section is refused: read it with `load_service_file`. Raises `JobFileError`.
    """
    shown = os.fspath(path)
    return parse_job_file(_read_text(shown), shown, **overrides)


def load_service_file(path: PathLike) -> ServiceRequest:
    """The `ServiceRequest` a file with a `service` section makes (`fallow service deploy FILE`):
    the service's settings, with the rest of the file as its replica. Raises `JobFileError`."""
    shown = os.fspath(path)
    return parse_service_file(_read_text(shown), shown)


def parse_job_file(text: str, path: str = "<job file>", **overrides: Any) -> JobRequest:
    """`load_job_file` of a job file's text; `path` is what errors name."""
    if _is_json(text, path):
        body = _json_object(text, path)
        return _with_overrides(_job_from_json(body, path), overrides)
    reader = _Reader(path)
    root = reader.root(text)
    job, _ = reader.read(root, service_form=False)
    return _with_overrides(JobRequest.from_dict(job), overrides)


def parse_service_file(text: str, path: str = "<job file>") -> ServiceRequest:
    """`load_service_file` of a file's text; `path` is what errors name."""
    if _is_json(text, path):
        body = _json_object(text, path)
        try:
            return ServiceRequest.from_dict(body, strict=True)
        except (TypeError, ValueError) as error:
            raise JobFileError(path, 1, 1, f"not the API's ServiceRequest: {error}") from None
    reader = _Reader(path)
    root = reader.root(text)
    job, service = reader.read(root, service_form=True)
    assert service is not None
    replica = JobRequest.from_dict(job)
    if "name" not in service:
        raise reader.fail(
            root,
            "the service has no name: give `name` (the file's) or `service.name`, the name in /s/NAME/…",
        )
    return ServiceRequest.from_dict({**service, "replica": replica.to_dict()})


# --------------------------------------------------------------------------------------------
# Reading the file


def _read_text(shown: str) -> str:
    try:
        with open(shown, "rb") as file:
            data = file.read(JOB_FILE_BYTES_MAX + 1)
    except OSError as error:
        raise JobFileError(shown, 1, 1, f"cannot read the job file: {error.strerror or error}") from None
    if len(data) > JOB_FILE_BYTES_MAX:
        raise JobFileError(shown, 1, 1, f"the job file is over {JOB_FILE_BYTES_MAX} bytes, the API's limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise JobFileError(shown, line, column, "the job file is not UTF-8 text") from None


def _is_json(text: str, path: str) -> bool:
    return path.endswith(".json") or text.lstrip().startswith("{")


def _json_object(text: str, path: str) -> Dict[str, Any]:
    try:
        body = json.loads(text)
    except json.JSONDecodeError as error:
        raise JobFileError(path, error.lineno, error.colno, f"not JSON: {error.msg}") from None
    if not isinstance(body, dict):
        raise JobFileError(path, 1, 1, "the file must hold one JSON object (the API's request)")
    return body


def _job_from_json(body: Dict[str, Any], path: str) -> JobRequest:
    try:
        return JobRequest.from_dict(body, strict=True)
    except (TypeError, ValueError) as error:
        raise JobFileError(path, 1, 1, f"not the API's JobRequest: {error}") from None


def _with_overrides(job: JobRequest, overrides: Dict[str, Any]) -> JobRequest:
    """The file's job with `overrides` over it, as flags go over a file (`env` adds to `envs`).
    What the file and the overrides leave out (`tier`, `max_price`, an image) is left out: the
    coordinator refuses a job without them, and says so."""
    for name, value in overrides.items():
        if not hasattr(job, name):
            raise TypeError(f"{name!r} is not a JobRequest field")
        if name == "env" and value is not None:
            value = {**(job.env or {}), **value}
        setattr(job, name, value)
    return job


class _Reader:
    """One file's nodes read into the API's fields, each fault at its key or value."""

    def __init__(self, shown: str) -> None:
        self.shown = shown
        #: Key nodes by their path, for faults found after the values are read.
        self.keys: Dict[Tuple[str, ...], Node] = {}

    # ---- YAML and faults

    def fail(self, node: Node, message: str) -> JobFileError:
        mark = node.start_mark
        return JobFileError(self.shown, mark.line + 1, mark.column + 1, message)

    def root(self, text: str) -> MappingNode:
        try:
            loader = yaml.SafeLoader(text)
            try:
                node = loader.get_single_node()
            finally:
                loader.dispose()
        except yaml.MarkedYAMLError as error:
            mark = error.problem_mark or error.context_mark
            problem = error.problem or error.context or "not YAML"
            line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            raise JobFileError(self.shown, line, column, f"not YAML: {problem}") from None
        except yaml.YAMLError as error:
            raise JobFileError(self.shown, 1, 1, f"not YAML: {error}") from None
        if node is None or (isinstance(node, ScalarNode) and _kind(node) == "null"):
            raise JobFileError(
                self.shown,
                1,
                1,
                "the job file is empty: give at least `resources`, `tier`, `max_price` and `run`",
            )
        if not isinstance(node, MappingNode):
            raise JobFileError(
                self.shown, 1, 1, f"a job file is a mapping of keys (name, resources, run, …), not {_described(node)}"
            )
        return node

    def items(
        self, node: MappingNode, path: Tuple[str, ...], allowed: Sequence[str], place: str
    ) -> Iterable[Tuple[str, Node, Node]]:
        """A mapping's entries in the file's order, each key known and given once."""
        seen: Dict[str, Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode) or _kind(key_node) == "null":
                raise self.fail(key_node, f"a key must be a word, not {_described(key_node)}")
            key = key_node.value
            if key in seen:
                raise self.fail(
                    key_node, f"`{key}` is given twice {place} (first on line {seen[key].start_mark.line + 1})"
                )
            seen[key] = key_node
            if key not in allowed:
                raise self.fail(key_node, f"unknown key `{key}` {place}; {_hint(key, path, allowed)}")
            self.keys[path + (key,)] = key_node
            if _kind(value_node) == "null":
                # An empty value counts as not given (docs/job-files.md, "Normal forms").
                continue
            yield key, key_node, value_node

    def mapping(self, node: Node, what: str) -> MappingNode:
        if not isinstance(node, MappingNode):
            raise self.fail(node, f"{what} is a mapping of keys, not {_described(node)}")
        return node

    # ---- values

    def text(self, node: Node, what: str) -> str:
        if not isinstance(node, ScalarNode):
            raise self.fail(node, f"{what} is text, not {_described(node)}")
        if _kind(node) == "null":
            raise self.fail(node, f"{what} has no value")
        return str(node.value)

    def choice(self, node: Node, what: str, choices: Sequence[str]) -> str:
        text = self.text(node, what)
        if text not in choices:
            raise self.fail(node, f"`{text}` is not one of {', '.join(choices)}")
        return text

    def boolean(self, node: Node, what: str) -> bool:
        if _kind(node) != "bool":
            shown = f"`{node.value}`" if isinstance(node, ScalarNode) else _described(node)
            raise self.fail(node, f"{what} is true or false, not {shown}")
        return str(node.value).lower() == "true"

    def whole(self, node: Node, what: str, low: int, high: int) -> int:
        if _kind(node) != "int":
            shown = f"`{node.value}`" if isinstance(node, ScalarNode) else _described(node)
            raise self.fail(node, f"{what} is a whole number ({low}–{high}), not {shown}")
        value = _int_of(node.value)
        if not low <= value <= high:
            raise self.fail(node, f"{value} is not in {low}–{high}")
        return value

    def fraction(self, node: Node, what: str) -> float:
        if _kind(node) not in ("int", "float"):
            shown = f"`{node.value}`" if isinstance(node, ScalarNode) else _described(node)
            raise self.fail(node, f"{what} is a number from 0 to 1, not {shown}")
        value = float(_float_text(node.value))
        if not 0.0 <= value <= 1.0:
            raise self.fail(node, f"{node.value} is not a fraction from 0 to 1")
        return value

    def amount(
        self, node: Node, what: str, rule: str, low_micros: int, high_micros: int, dollar_sign: bool = False
    ) -> str:
        """A decimal amount of `low_micros` to `high_micros` millionths, in its normal form: text
        without trailing zeros."""
        written = self.text(node, what)
        text = written.strip()
        if dollar_sign and text.startswith("$"):
            text = text[1:]
        micros = _micros(text)
        if micros is None or not low_micros <= micros <= high_micros:
            raise self.fail(node, f"`{written}` is not {rule}")
        return _micros_text(micros)

    def cpus(self, node: Node) -> int:
        written = self.text(node, "`cpus`")
        text = written.strip()
        text = text[:-1].rstrip() if text.endswith("+") else text
        micros = _micros(text)
        if micros is None or micros % 1000 != 0 or not 1 <= micros // 1000 <= U32_MAX:
            raise self.fail(
                node,
                f"`{written}` is not a number of cores, more than 0 with at most three decimals (e.g. 4, 0.5 or 4+)",
            )
        return micros // 1000

    def size_bytes(self, node: Node, what: str, default_unit: int) -> int:
        written = self.text(node, what)
        text = written.strip()
        text = text[:-1].rstrip() if text.endswith("+") else text
        match = _SIZE.match(text)
        unit = match.group("unit") if match else ""
        number = match.group("number") if match else ""
        decimals = number.partition(".")[2]
        if match is None or number in ("", ".") or len(decimals) > 6 or (unit and unit not in _SIZE_UNITS):
            default = "GiB" if default_unit == 1 << 30 else "bytes"
            raise self.fail(
                node,
                f"`{written}` is not a size: a number of {default} with at most six decimals, or a number and a "
                f"unit ({_SIZE_UNITS_TEXT})",
            )
        return math.ceil(Decimal(number) * (_SIZE_UNITS[unit] if unit else default_unit))

    def size_mib(self, node: Node, what: str, high_mib: int) -> int:
        mib = -(-self.size_bytes(node, what, 1 << 30) // (1 << 20))
        if mib > high_mib:
            raise self.fail(node, f"`{node.value}` is more memory than any node has (at most {high_mib} MiB)")
        return mib

    def seconds(self, node: Node, what: str, low: int, high: int) -> int:
        written = self.text(node, what)
        seconds = _duration_s(written.strip())
        if seconds is None:
            raise self.fail(
                node,
                f"`{written}` is not a duration: a whole number of seconds, or whole numbers with units s, m, h, "
                "d, largest first (e.g. 90s, 15m, 12h, 2d, 1h30m)",
            )
        if not low <= seconds <= high:
            raise self.fail(node, f"`{written}` is not from {_duration_text(low)} to {_duration_text(high)}")
        return seconds

    def words(self, node: Node, what: str) -> List[str]:
        if not isinstance(node, SequenceNode):
            raise self.fail(
                node,
                f"{what} is a list of words run as they are (e.g. [python, train.py]), not {_described(node)}; "
                "a shell command goes in `run`",
            )
        return [self.text(item, f"each word of {what}") for item in node.value]

    # ---- the sections

    def read(self, root: MappingNode, service_form: bool) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
        """The JobRequest's fields the file gives, and with `service_form` the ServiceRequest's own."""
        job: Dict[str, Any] = {}
        given: Dict[str, Any] = {}
        resources: Dict[str, Any] = {}
        service_node: Optional[Node] = None
        for key, _, value in self.items(root, (), TOP_KEYS, "at the top level"):
            if key == "name":
                given[key] = self.text(value, "`name`")
            elif key == "resources":
                resources = self.resources(value)
            elif key == "num_nodes":
                given[key] = self.whole(value, "`num_nodes`", 1, REPLICAS_MAX)
            elif key == "tier":
                given[key] = self.choice(value, "`tier`", TIERS)
            elif key == "max_price":
                given[key] = self.amount(
                    value,
                    "`max_price`",
                    "a price in dollars per GPU-hour, more than 0 and at most 1000, with at most six decimals "
                    "(e.g. 2.50)",
                    1,
                    PRICE_MICROS_MAX,
                    dollar_sign=True,
                )
            elif key == "preemptible":
                given[key] = self.boolean(value, "`preemptible`")
            elif key == "class":
                given[key] = self.choice(value, "`class`", CLASSES)
            elif key == "max_runtime":
                given[key] = self.seconds(value, "`max_runtime`", 1, RUNTIME_S_MAX)
            elif key == "envs":
                given[key] = self.envs(value)
            elif key in ("setup", "run", "client_token"):
                given[key] = self.text(value, f"`{key}`")
            elif key == "command":
                given[key] = self.words(value, "`command`")
            elif key == "runtime":
                given[key] = self.choice(value, "`runtime`", RUNTIMES)
            elif key == "datasets":
                given[key] = self.datasets(value)
            elif key == "checkpoint":
                given[key] = self.checkpoint(value)
            elif key == "gang":
                given[key] = self.gang(value)
            elif key == "network":
                given[key] = self.choice(value, "`network`", NETWORKS)
            elif key == "output_url":
                url = self.text(value, "`output_url`")
                if not url.startswith(("http://", "https://")):
                    raise self.fail(value, f"`{url}` is not an http(s):// URL (the agent PUTs the output archive to it)")
                given[key] = url
            elif key == "reservation":
                given[key] = self.whole(value, "`reservation`", 1, ID_MAX)
            elif key == "service":
                given[key] = self.service(value)
                service_node = value

        # The API's fields from the keys read, and the faults of keys that cannot go together.
        if "name" in given:
            job["name"] = given["name"]
        if "accelerators" in resources and "compute_units" in resources:
            raise self.fail(
                self.keys[("resources", "compute_units")],
                "give `accelerators` or `compute_units`, not both: compute units let the matcher choose the GPUs",
            )
        if "accelerators" in resources:
            models, count_key, count = resources["accelerators"]
            if models:
                job["gpu_models"] = models
            job[count_key] = count
        for file_key, api_key in (
            ("compute_units", "compute_units"),
            ("cpus", "cpu_milli"),
            ("memory", "memory_mib"),
            ("gpu_memory", "gpu_memory_mib_min"),
            ("regions", "regions"),
            ("topology", "topology"),
            ("min_reliability", "min_reliability"),
        ):
            if file_key in resources:
                job[api_key] = resources[file_key]
        if "num_nodes" in given:
            if service_form:
                raise self.fail(
                    self.keys[("num_nodes",)],
                    "a service's replicas are counted by `service.replicas` or `service.replica_policy`, "
                    "not `num_nodes`",
                )
            job["replicas"] = given["num_nodes"]
        for file_key, api_key in (
            ("tier", "tier"),
            ("max_price", "max_price_per_gpu_hour"),
            ("preemptible", "preemptible"),
            ("class", "class"),
            ("max_runtime", "max_runtime_s"),
            ("envs", "env"),
            ("datasets", "datasets"),
        ):
            if file_key in given:
                job[api_key] = given[file_key]
        for file_key, value in given.get("checkpoint", {}).items():
            job[{"dir": "checkpoint_dir", "interval": "checkpoint_interval_s"}[file_key]] = value
        for file_key, value in given.get("gang", {}).items():
            job[
                {"repair": "gang_repair", "max_restarts": "max_restarts", "repair_billing": "repair_billing"}[file_key]
            ] = value
        for key in ("network", "client_token", "output_url"):
            if key in given:
                job[key] = given[key]
        if "reservation" in given:
            if service_form:
                raise self.fail(
                    self.keys[("reservation",)],
                    "a service's replicas run on the market, not inside a booking: `reservation` is for jobs",
                )
            job["reservation"] = given["reservation"]
        self.program(job, given, resources)

        if not service_form:
            if service_node is not None:
                raise self.fail(
                    self.keys[("service",)],
                    "this file describes a service: read it with `load_service_file` (`fallow service deploy FILE`)",
                )
            if "ports" in resources:
                raise self.fail(
                    self.keys[("resources", "ports")],
                    "`ports` are a service's: read the file with `load_service_file` (`fallow service deploy FILE`)",
                )
            return job, None
        return job, self.service_fields(given.get("service", {}), resources, given.get("name"))

    def program(self, job: Dict[str, Any], given: Dict[str, Any], resources: Dict[str, Any]) -> None:
        """What runs: the image and its command, or the host's program and its arguments."""
        setup, run, command = given.get("setup"), given.get("run"), given.get("command")
        if command is not None and (setup is not None or run is not None):
            raise self.fail(
                self.keys[("command",)],
                "give `command` (words run as they are) or `setup` and `run` (shell scripts), not both",
            )
        if setup is not None and run is None:
            raise self.fail(self.keys[("setup",)], "`setup` needs `run` after it: the job's exit status is the run's")
        script: Optional[str] = None
        if setup is not None and run is not None:
            script = f"set -e\n{setup.rstrip()}\nset +e\n{run}"
        elif run is not None:
            script = run
        runtime = given.get("runtime")
        if runtime is not None:
            job["runtime"] = runtime
        if runtime == "process":
            if "image_id" in resources:
                raise self.fail(
                    self.keys[("resources", "image_id")],
                    "a process job runs a program on the host, not an image: drop `image_id` or `runtime: process`",
                )
            if script is not None:
                job["image"], job["command"] = "sh", ["-c", script]
            elif command:
                job["image"], job["command"] = command[0], command[1:]
            else:
                raise self.fail(
                    self.keys[("runtime",)],
                    "a process job needs `run` (a shell script) or `command` (the program and its arguments)",
                )
            return
        if "image_id" in resources:
            job["image"] = resources["image_id"]
        if script is not None:
            job["command"] = ["sh", "-c", script]
        elif command is not None:
            job["command"] = command

    def resources(self, node: Node) -> Dict[str, Any]:
        node = self.mapping(node, "`resources`")
        found: Dict[str, Any] = {}
        for key, _, value in self.items(node, ("resources",), RESOURCE_KEYS, "in resources"):
            if key == "accelerators":
                found[key] = self.accelerators(value)
            elif key == "compute_units":
                found[key] = self.amount(
                    value,
                    "`compute_units`",
                    "compute units, 0.001–64 (1.0 = one H100 SXM) with at most six decimals, e.g. 2.5",
                    1_000,
                    COMPUTE_UNITS_MICROS_MAX,
                )
            elif key == "cpus":
                found[key] = self.cpus(value)
            elif key == "memory":
                found[key] = self.size_mib(value, "`memory`", MEMORY_MIB_MAX)
            elif key == "gpu_memory":
                found[key] = self.size_mib(value, "`gpu_memory`", U32_MAX)
            elif key == "image_id":
                image = self.text(value, "`image_id`")
                found[key] = image[len("docker:") :] if image.startswith("docker:") else image
            elif key == "ports":
                found[key] = self.port(value)
            elif key == "regions":
                found[key] = self.regions(value)
            elif key == "topology":
                found[key] = self.choice(value, "`topology`", TOPOLOGIES)
            elif key == "min_reliability":
                found[key] = self.fraction(value, "`min_reliability`")
        return found

    def accelerators(self, node: Node) -> Tuple[List[str], str, int]:
        """(models, the API's count field, its value) from SkyPilot's forms: `H100:8`, `H100`,
        `A100:0.25`, `{H100: 8, H200: 8}`, `[H100:8, H200:8]`, or a count alone."""
        items: List[Tuple[str, Tuple[str, int], Node]] = []
        if isinstance(node, ScalarNode) and _kind(node) in ("int", "float"):
            count_key, count_value = self.count(str(node.value), node)
            return [], count_key, count_value
        if isinstance(node, ScalarNode):
            items.append(self.accelerator(node))
        elif isinstance(node, SequenceNode):
            if not node.value:
                raise self.fail(node, "no GPU model given: give MODEL:COUNT, e.g. H100:8")
            for item in node.value:
                if not isinstance(item, ScalarNode) or _kind(item) == "null":
                    raise self.fail(
                        item, f"each of `accelerators` is MODEL:COUNT (e.g. H100:8), not {_described(item)}"
                    )
                items.append(self.accelerator(item))
        else:
            if not node.value:
                raise self.fail(node, "no GPU model given: give MODEL:COUNT, e.g. H100:8")
            seen: Dict[str, Node] = {}
            for key_node, value_node in node.value:
                model = self.text(key_node, "a GPU model")
                if model in seen:
                    raise self.fail(key_node, f"`{model}` is given twice in accelerators")
                seen[model] = key_node
                if _kind(value_node) == "null":
                    raise self.fail(
                        value_node,
                        f"`{model}` has no count: write `{{MODEL: COUNT}}` with a space after the colon "
                        "(e.g. {H100: 8}), or a list [H100:8, H200:8]",
                    )
                count_text = self.text(value_node, f"the count of `{model}`")
                items.append((model.strip(), self.count(count_text, value_node), value_node))
        count = items[0][1]
        models: List[str] = []
        for model, other, _ in items:
            if other != count:
                raise self.fail(node, "the models are alternatives: give them one count (e.g. [H100:8, H200:8])")
            if model not in models:
                models.append(model)
        return models, count[0], count[1]

    def accelerator(self, node: ScalarNode) -> Tuple[str, Tuple[str, int], Node]:
        text = str(node.value)
        model, colon, count_text = text.rpartition(":")
        if not colon:
            model, count = text, ("gpus", 1)
        else:
            count = self.count(count_text, node)
        if not model.strip():
            raise self.fail(node, f"`{text}` names no GPU model: give MODEL:COUNT, e.g. H100:8")
        return model.strip(), count, node

    def count(self, text: str, node: Node) -> Tuple[str, int]:
        """`gpus` and a whole count, or `gpu_share_milli` and a share in thousandths."""
        micros = _micros(text.strip())
        if micros is not None and 1_000 <= micros <= 999_000 and micros % 1_000 == 0:
            return "gpu_share_milli", micros // 1_000
        if micros is not None and micros % 1_000_000 == 0 and 1 <= micros // 1_000_000 <= GPUS_PER_REPLICA_MAX:
            return "gpus", micros // 1_000_000
        if micros is not None and micros % 1_000_000 == 0 and micros // 1_000_000 > GPUS_PER_REPLICA_MAX:
            raise self.fail(
                node,
                f"{text.strip()} GPUs are more than one node holds (1–16): ask for more replicas (`num_nodes`) "
                "with fewer GPUs each",
            )
        raise self.fail(node, f"`{text.strip()}` is not {_COUNT_RULE}")

    def port(self, node: Node) -> int:
        rule = "a port, 1–65535 (a replica serves one)"
        if isinstance(node, SequenceNode):
            if len(node.value) != 1:
                raise self.fail(node, f"give one port: {rule}")
            node = node.value[0]
        text = self.text(node, "`ports`").strip()
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            raise self.fail(node, f"`{node.value}` is not {rule}")
        return int(text)

    def regions(self, node: Node) -> List[str]:
        if isinstance(node, SequenceNode):
            regions = [self.text(item, "each of `regions`") for item in node.value]
        elif isinstance(node, ScalarNode):
            regions = [self.text(node, "`regions`")]
        else:
            raise self.fail(node, f"`regions` is a region or a list of regions, not {_described(node)}")
        if len(regions) > REGIONS_MAX:
            raise self.fail(node, f"at most {REGIONS_MAX} regions")
        return regions

    def envs(self, node: Node) -> Dict[str, str]:
        node = self.mapping(node, "`envs`")
        env: Dict[str, str] = {}
        seen: Dict[str, Node] = {}
        for key_node, value_node in node.value:
            name = self.text(key_node, "an environment variable's name")
            if name in seen:
                raise self.fail(
                    key_node, f"`{name}` is given twice in envs (first on line {seen[name].start_mark.line + 1})"
                )
            seen[name] = key_node
            if _kind(value_node) == "null":
                raise self.fail(
                    key_node, f"the environment variable `{name}` has no value: give one here, or leave it out"
                )
            if not isinstance(value_node, ScalarNode):
                raise self.fail(
                    value_node,
                    f"the environment variable `{name}` is text, a number or true/false, not {_described(value_node)}",
                )
            env[name] = str(value_node.value)
        return env

    def datasets(self, node: Node) -> List[Dict[str, Any]]:
        if not isinstance(node, SequenceNode):
            raise self.fail(node, f"`datasets` is a list of datasets (url, digest, size), not {_described(node)}")
        found = []
        for item in node.value:
            if isinstance(item, ScalarNode) and _kind(item) != "null":
                found.append(self.dataset_text(item))
                continue
            if not isinstance(item, MappingNode):
                raise self.fail(
                    item,
                    "a dataset is a mapping of `url`, `digest` and `size`, or URL,DIGEST,SIZE_BYTES, "
                    f"not {_described(item)}",
                )
            dataset: Dict[str, Any] = {}
            for key, _, value in self.items(item, ("datasets",), DATASET_KEYS, "in a dataset"):
                if key == "url":
                    dataset["url"] = self.text(value, "a dataset's `url`")
                elif key == "digest":
                    digest = self.text(value, "a dataset's `digest`")
                    if not _DIGEST.match(digest.strip()):
                        raise self.fail(value, f"dataset digest `{digest}` is not blake3:<64 hex> or sha256:<64 hex>")
                    dataset["digest"] = digest
                elif key == "size":
                    size = self.size_bytes(value, "a dataset's `size`", 1)
                    if size > 2**63 - 1:
                        raise self.fail(value, f"`{value.value}` is more than 2^63 - 1 bytes")
                    dataset["size_bytes"] = size
            for key, api_key in (("url", "url"), ("digest", "digest"), ("size", "size_bytes")):
                if api_key not in dataset:
                    raise self.fail(item, f"a dataset needs `{key}` (it has url, digest and size)")
            found.append({"url": dataset["url"], "digest": dataset["digest"], "size_bytes": dataset["size_bytes"]})
        return found

    def dataset_text(self, node: ScalarNode) -> Dict[str, Any]:
        text = str(node.value)
        parts = text.rsplit(",", 2)
        rule = f"`{text}` is not URL,DIGEST,SIZE_BYTES (e.g. https://host/data.tar,blake3:<64 hex>,1048576)"
        if len(parts) != 3 or not parts[2].strip().isdigit():
            raise self.fail(node, rule)
        url, digest, size = (part.strip() for part in parts)
        if not _DIGEST.match(digest):
            raise self.fail(node, f"dataset digest `{digest}` is not blake3:<64 hex> or sha256:<64 hex>")
        if int(size) > 2**63 - 1:
            raise self.fail(node, f"`{size}` is more than 2^63 - 1 bytes")
        return {"url": url, "digest": digest, "size_bytes": int(size)}

    def checkpoint(self, node: Node) -> Dict[str, Any]:
        node = self.mapping(node, "`checkpoint`")
        found: Dict[str, Any] = {}
        for key, _, value in self.items(node, ("checkpoint",), CHECKPOINT_KEYS, "in checkpoint"):
            if key == "dir":
                found[key] = self.text(value, "`checkpoint.dir`")
                if not found[key].startswith("/") or ".." in found[key].split("/"):
                    raise self.fail(value, f"`{found[key]}` is not an absolute path without `..` (e.g. /ckpt)")
            else:
                found[key] = self.seconds(value, "`checkpoint.interval`", 1, U32_MAX)
        return found

    def gang(self, node: Node) -> Dict[str, Any]:
        node = self.mapping(node, "`gang`")
        found: Dict[str, Any] = {}
        for key, _, value in self.items(node, ("gang",), GANG_KEYS, "in gang"):
            if key == "repair":
                found[key] = self.choice(value, "`gang.repair`", GANG_REPAIRS)
            elif key == "max_restarts":
                found[key] = self.whole(value, "`gang.max_restarts`", 0, 100)
            else:
                found[key] = self.choice(value, "`gang.repair_billing`", REPAIR_BILLINGS)
        return found

    def service(self, node: Node) -> Dict[str, Any]:
        node = self.mapping(node, "`service`")
        found: Dict[str, Any] = {}
        for key, _, value in self.items(node, ("service",), SERVICE_KEYS, "in service"):
            if key == "name":
                found[key] = self.text(value, "`service.name`")
            elif key == "readiness_probe":
                found[key] = self.probe(value)
            elif key == "replicas":
                found[key] = self.whole(value, "`service.replicas`", 0, SERVICE_REPLICAS_MAX)
            elif key == "replica_policy":
                found[key] = self.policy(value)
            elif key == "wake_timeout":
                found[key] = self.seconds(value, "`service.wake_timeout`", 0, SERVICE_SECONDS_MAX)
        return found

    def probe(self, node: Node) -> Dict[str, Any]:
        if isinstance(node, ScalarNode):
            return {"path": self.text(node, "`readiness_probe`")}
        if not isinstance(node, MappingNode):
            raise self.fail(
                node,
                f"`readiness_probe` is an HTTP path (e.g. /health) or a mapping of `path` and "
                f"`initial_delay_seconds`, not {_described(node)}",
            )
        found: Dict[str, Any] = {}
        place = "in service.readiness_probe"
        for key, _, value in self.items(node, ("service", "readiness_probe"), PROBE_KEYS, place):
            if key == "path":
                found[key] = self.text(value, "`readiness_probe.path`")
            else:
                found[key] = self.whole(value, "`initial_delay_seconds`", 0, SERVICE_SECONDS_MAX)
        return found

    def policy(self, node: Node) -> Dict[str, Any]:
        node = self.mapping(node, "`replica_policy`")
        found: Dict[str, Any] = {}
        place = "in service.replica_policy"
        for key, _, value in self.items(node, ("service", "replica_policy"), POLICY_KEYS, place):
            if key == "burst_tier":
                found[key] = self.choice(value, "`burst_tier`", TIERS)
            elif key in ("min_replicas", "max_replicas"):
                found[key] = self.whole(value, f"`{key}`", 0, SERVICE_REPLICAS_MAX)
            elif key in ("upscale_delay_seconds", "downscale_delay_seconds"):
                found[key] = self.whole(value, f"`{key}`", 0, SERVICE_SECONDS_MAX)
            else:
                found[key] = self.whole(value, f"`{key}`", 1, U32_MAX)
        return found

    def service_fields(
        self, service: Dict[str, Any], resources: Dict[str, Any], file_name: Optional[str]
    ) -> Dict[str, Any]:
        """The ServiceRequest's own fields, from `service` and `resources.ports`."""
        fields: Dict[str, Any] = {}
        name = service.get("name", file_name)
        if name is not None:
            fields["name"] = name
        if "ports" in resources:
            fields["port"] = resources["ports"]
        probe = service.get("readiness_probe", {})
        if "path" in probe:
            fields["health_path"] = probe["path"]
        if "initial_delay_seconds" in probe:
            fields["health_timeout_s"] = probe["initial_delay_seconds"]
        if "replicas" in service and "replica_policy" in service:
            raise self.fail(
                self.keys[("service", "replica_policy")],
                "give `replicas` (a fixed count) or `replica_policy` (bounds and targets), not both",
            )
        if "replicas" in service:
            fields["min_replicas"] = fields["max_replicas"] = service["replicas"]
        policy = service.get("replica_policy", {})
        for file_key, api_key in (
            ("min_replicas", "min_replicas"),
            ("max_replicas", "max_replicas"),
            ("target_in_flight", "target_in_flight"),
            ("target_p95_ms", "target_p95_ms"),
            ("upscale_delay_seconds", "scale_up_after_s"),
            ("downscale_delay_seconds", "scale_down_after_s"),
            ("burst_tier", "burst_tier"),
        ):
            if file_key in policy:
                fields[api_key] = policy[file_key]
        if "wake_timeout" in service:
            fields["wake_timeout_s"] = service["wake_timeout"]
        return fields


# --------------------------------------------------------------------------------------------
# Scalars


def _kind(node: Node) -> str:
    """What a node is: mapping, list, or for a scalar null, bool, int, float or text (YAML 1.2's
    core schema for plain scalars; a quoted or block scalar is text)."""
    if isinstance(node, MappingNode):
        return "mapping"
    if isinstance(node, SequenceNode):
        return "list"
    if not isinstance(node, ScalarNode) or node.style is not None:
        return "text"
    text = str(node.value)
    if _NULL.match(text):
        return "null"
    if _BOOL.match(text):
        return "bool"
    if _INT.match(text):
        return "int"
    if _FLOAT.match(text):
        return "float"
    return "text"


def _described(node: Node) -> str:
    return {
        "mapping": "a mapping",
        "list": "a list",
        "null": "empty",
        "bool": f"`{getattr(node, 'value', '')}`",
        "int": f"the number {getattr(node, 'value', '')}",
        "float": f"the number {getattr(node, 'value', '')}",
        "text": f"the text `{getattr(node, 'value', '')}`",
    }[_kind(node)]


def _int_of(text: str) -> int:
    if text.startswith("0x"):
        return int(text[2:], 16)
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 10)


def _float_text(text: str) -> str:
    lowered = text.lower()
    if lowered.endswith(".inf"):
        return lowered.replace(".inf", "inf")
    if lowered == ".nan":
        return "nan"
    return text


def _micros(text: str) -> Optional[int]:
    """Decimal text with at most six decimals as millionths (`3.20` is 3_200_000), or None."""
    match = _AMOUNT.match(text)
    if match is None:
        return None
    whole, fraction = match.group("whole"), match.group("fraction") or ""
    if (not whole and not fraction) or len(fraction) > 6:
        return None
    return int(whole or "0") * 1_000_000 + int((fraction + "000000")[:6])


def _micros_text(micros: int) -> str:
    """Millionths as decimal text without trailing zeros: 3_200_000 is "3.2", 8_000_000 "8"."""
    whole, fraction = divmod(micros, 1_000_000)
    if fraction == 0:
        return str(whole)
    return f"{whole}.{fraction:06d}".rstrip("0")


def _duration_s(text: str) -> Optional[int]:
    """`90`, `90s`, `15m`, `1h30m`: seconds, or None. Units go largest first, each once."""
    if text.isdigit():
        return int(text)
    if not _DURATION.match(text):
        return None
    total, previous = 0, None
    for number, unit in _DURATION_PART.findall(text):
        size = _DURATION_UNITS[unit]
        if previous is not None and size >= previous:
            return None
        total, previous = total + int(number) * size, size
    return total


def _duration_text(seconds: int) -> str:
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _hint(key: str, path: Tuple[str, ...], allowed: Sequence[str]) -> str:
    if key in HINTS:
        return HINTS[key]
    if path == () and key in RESOURCE_KEYS:
        return f"`{key}` goes in `resources`"
    if path == ("resources",) and key in TOP_KEYS:
        return f"`{key}` goes at the top level, not in resources"
    return f"the keys here are {', '.join(key for key in allowed)}"


__all__ = [
    "JOB_FILE_BYTES_MAX",
    "load_job_file",
    "load_service_file",
    "parse_job_file",
    "parse_service_file",
]
