"""The job file loader against docs/job-files.md: every key, the accelerators' forms, sizes,
durations, the normal forms, SkyPilot's keys with their hints, and each fault's line and column."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any, Dict

import pytest

from fallow_client import (
    JobFileError,
    JobRequest,
    ServiceRequest,
    load_job_file,
    load_service_file,
    parse_job_file,
    parse_service_file,
)

from .conftest import JOBFILES

#: The lines every inline case shares after its own: enough for a valid process job.
BASE = "tier: bronze\nmax_price: 2\nruntime: process\nrun: echo\n"


def request(text: str, **overrides: Any) -> Dict[str, Any]:
    """The JobRequest body of a job file's text."""
    return parse_job_file(textwrap.dedent(text), "job.yaml", **overrides).to_dict()


def refusal(text: str, service: bool = False) -> JobFileError:
    with pytest.raises(JobFileError) as caught:
        (parse_service_file if service else parse_job_file)(textwrap.dedent(text), "job.yaml")
    return caught.value


# ---- the sample files


def test_every_key_of_the_job_form() -> None:
    job = load_job_file(JOBFILES / "full.yaml")
    assert isinstance(job, JobRequest)
    assert job.to_dict() == {
        "name": "full-house",
        "image": "registry.example.com/team/train:1.2",
        # setup then run: `set -e`, the setup (trailing blank lines dropped), `set +e`, the run.
        "command": ["sh", "-c", "set -e\npip install -r requirements.txt\nset +e\npython eval.py\n"],
        # Scalars as written: 3.0 stays "3.0", yes stays "yes", 0x1F stays "0x1F".
        "env": {
            "FLOAT": "3.0",
            "BOOL": "yes",
            "TRUE_BOOL": "true",
            "INT": "0x1F",
            "QUOTED": "07",
            "TEXT": "plain text",
        },
        "gpus": 8,
        # The file's order, without repeats.
        "gpu_models": ["H100", "H200", "H100-SXM5"],
        "cpu_milli": 4000,
        "memory_mib": 1536,
        "gpu_memory_mib_min": 76294,  # 80 GB = 80e9 bytes, rounded up to MiB
        "regions": ["eu-west"],
        "topology": "fabric",
        "min_reliability": 0.9,
        "replicas": 4,
        "tier": "silver",
        "max_price_per_gpu_hour": "2.5",
        "preemptible": True,
        "class": "eval",
        "max_runtime_s": 2 * 86_400,
        "datasets": [
            {
                "url": "https://data.example.com/a.tar",
                "digest": "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "size_bytes": 1 << 30,
            },
            {
                "url": "https://data.example.com/b.tar",
                "digest": "blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
                "size_bytes": 512,
            },
        ],
        "checkpoint_dir": "/ckpt",
        "checkpoint_interval_s": 90,
        "gang_repair": "keep",
        "max_restarts": 0,
        "repair_billing": "pause",
        "network": "bridge",
        "client_token": "sweep-2026-12-07",
        "output_url": "https://bucket.example/sweep/out-{replica}.tar?X-Sig=abc",
        "reservation": 12,
    }
    assert job.class_ == "eval"


def test_a_process_job_runs_its_first_word() -> None:
    assert load_job_file(JOBFILES / "process_command.yaml").to_dict() == {
        "name": "words",
        "gpu_share_milli": 250,
        "tier": "bronze",
        "max_price_per_gpu_hour": "1",
        "runtime": "process",
        "image": "python3",
        "command": ["-c", "print('hi')", "42"],
    }


def test_a_container_job_runs_its_command_in_its_image() -> None:
    assert load_job_file(JOBFILES / "container_command.yaml").to_dict() == {
        "gpu_models": ["A100", "A100-80GB"],
        "gpu_share_milli": 500,
        "tier": "gold",
        "max_price_per_gpu_hour": "10",
        "image": "busybox:1.36",
        "command": ["echo", "hello world"],
    }


def test_a_service_file() -> None:
    service = load_service_file(JOBFILES / "service.yaml")
    assert isinstance(service, ServiceRequest)
    assert service.to_dict() == {
        "name": "chat-api",
        "replica": {
            "name": "chat",
            "gpus": 1,
            "gpu_models": ["L4"],
            "tier": "silver",
            "max_price_per_gpu_hour": "1.2",
            "image": "vllm/vllm-openai:v0.6.4",
            "command": ["sh", "-c", "vllm serve meta-llama/Llama-3.2-1B --port 8080"],
        },
        "port": 8080,
        "health_path": "/health",
        "min_replicas": 2,
        "max_replicas": 2,
        "wake_timeout_s": 120,
    }


def test_a_service_file_is_refused_as_a_job_with_the_service_form_named() -> None:
    with pytest.raises(JobFileError) as caught:
        load_job_file(JOBFILES / "service.yaml")
    assert (caught.value.line, caught.value.column) == (9, 1)
    assert "load_service_file" in caught.value.message


def test_a_service_may_not_run_inside_a_booking(tmp_path: Path) -> None:
    path = tmp_path / "service.yaml"
    path.write_text((JOBFILES / "service.yaml").read_text() + "reservation: 3\n")
    with pytest.raises(JobFileError) as caught:
        load_service_file(path)
    assert "not inside a booking" in caught.value.message, str(caught.value)


def test_the_apis_json_is_read_as_it_is() -> None:
    job = load_job_file(JOBFILES / "job.json")
    assert job.to_dict() == {
        "image": "sh",
        "runtime": "process",
        "command": ["-c", "echo json"],
        "tier": "bronze",
        "max_price_per_gpu_hour": "1.5",
        "gpu_share_milli": 100,
        "class": "eval",
    }
    # A first `{` makes any file JSON; a `.json` name makes any text JSON.
    assert parse_job_file('  {"image": "x", "tier": "gold"}', "job.yaml").to_dict() == {"image": "x", "tier": "gold"}
    with pytest.raises(JobFileError) as caught:
        parse_job_file("tier: gold\n", "job.json")
    assert caught.value.message.startswith("not JSON")
    with pytest.raises(JobFileError) as caught:
        parse_job_file('{"image": "x", "gpu": 1}', "job.json")
    assert "unknown field `gpu`" in caught.value.message


# ---- every mistake at its line and column


BAD = sorted((JOBFILES / "bad").glob("*.yaml"))


def expectation(path: Path) -> "tuple[int, int, str]":
    """A bad file's first line: `# expect: LINE:COLUMN words of the message`."""
    match = re.match(r"# expect: (\d+):(\d+) (.*)", path.read_text().splitlines()[0])
    assert match, f"{path} has no `# expect: LINE:COLUMN message` first line"
    return int(match.group(1)), int(match.group(2)), match.group(3)


def is_service_file(text: str) -> bool:
    return any(line.startswith("service:") for line in text.splitlines())


@pytest.mark.parametrize("path", BAD, ids=[path.stem for path in BAD])
def test_a_bad_file_is_refused_where_it_is(path: Path) -> None:
    line, column, words = expectation(path)
    load = load_service_file if is_service_file(path.read_text()) else load_job_file
    with pytest.raises(JobFileError) as caught:
        load(path)
    fault = caught.value
    assert (fault.line, fault.column) == (line, column), str(fault)
    assert words in fault.message, str(fault)
    assert str(fault) == f"{path}:{line}:{column}: {fault.message}"
    assert fault.path == str(path)
    assert isinstance(fault, ValueError)


# ---- resources.accelerators and compute units


@pytest.mark.parametrize(
    "written, fields",
    [
        ("H100:8", {"gpus": 8, "gpu_models": ["H100"]}),
        ("H100", {"gpus": 1, "gpu_models": ["H100"]}),
        ("H100-SXM5:16", {"gpus": 16, "gpu_models": ["H100-SXM5"]}),
        ("A100:0.25", {"gpu_share_milli": 250, "gpu_models": ["A100"]}),
        ("A100:0.001", {"gpu_share_milli": 1, "gpu_models": ["A100"]}),
        ("H100:1.0", {"gpus": 1, "gpu_models": ["H100"]}),
        ("{H100: 8, H200: 8}", {"gpus": 8, "gpu_models": ["H100", "H200"]}),
        ("[H100:8, H200:8]", {"gpus": 8, "gpu_models": ["H100", "H200"]}),
        ("[H200:2, H100:2, H200:2]", {"gpus": 2, "gpu_models": ["H200", "H100"]}),
        ("{L4: 0.5}", {"gpu_share_milli": 500, "gpu_models": ["L4"]}),
        ("8", {"gpus": 8}),
        ("0.5", {"gpu_share_milli": 500}),
    ],
)
def test_accelerators_forms(written: str, fields: Dict[str, Any]) -> None:
    body = request(f"resources:\n  accelerators: {written}\n" + BASE)
    assert {key: body[key] for key in ("gpus", "gpu_share_milli", "gpu_models") if key in body} == fields


@pytest.mark.parametrize(
    "written, says",
    [
        ("H100:0", "is not a whole number of GPUs"),
        ("H100:17", "17 GPUs are more than one node holds"),
        ("0", "is not a whole number of GPUs"),
        ("H100:1.5", "is not a whole number of GPUs"),
        ("A100:0.0005", "is not a whole number of GPUs"),
        ("H100:-1", "is not a whole number of GPUs"),
        ("H100:lots", "is not a whole number of GPUs"),
        (":8", "names no GPU model"),
        ("[]", "no GPU model given"),
        ("{}", "no GPU model given"),
        ("[H100:8, H200:4]", "the models are alternatives"),
        ("{H100: 8, H200: 0.5}", "the models are alternatives"),
        ("{H100: 8, H100: 8}", "`H100` is given twice"),
        ("{H100:8}", "has no count"),
    ],
)
def test_accelerators_mistakes(written: str, says: str) -> None:
    fault = refusal(f"resources:\n  accelerators: {written}\n" + BASE)
    assert says in fault.message
    assert fault.line == 2


def test_compute_units_are_a_decimal_in_normal_form_and_not_given_with_accelerators() -> None:
    assert request("resources:\n  compute_units: 2.50\n" + BASE)["compute_units"] == "2.5"
    assert request("resources:\n  compute_units: 8\n" + BASE)["compute_units"] == "8"
    assert request("resources:\n  compute_units: '0.001'\n" + BASE)["compute_units"] == "0.001"
    for bad in ("0", "64.5", "0.0005", "lots"):
        assert "is not compute units" in refusal(f"resources:\n  compute_units: {bad}\n" + BASE).message
    fault = refusal("resources:\n  accelerators: H100:1\n  compute_units: 2\n" + BASE)
    assert (fault.line, fault.column) == (3, 3)
    assert "not both" in fault.message


def test_no_accelerators_is_a_cpu_only_job() -> None:
    body = request("resources:\n  cpus: 2\n" + BASE)
    assert not {"gpus", "gpu_share_milli", "compute_units", "gpu_models"} & set(body)


# ---- sizes, durations, cores, prices


@pytest.mark.parametrize(
    "written, mib",
    [
        ("32", 32 * 1024),
        ("1.5", 1536),
        ("'32+'", 32 * 1024),
        ("512MiB", 512),
        ("1.5GiB", 1536),
        ("2TiB", 2 * 1024 * 1024),
        ("40GB", 38147),  # 40e9 bytes, rounded up
        ("1KB", 1),  # rounded up
        ("1 GiB", 1024),
        ("1GiB+", 1024),
        ("1048576B", 1),
        ("0.000001TiB", 2),  # 1.1 MiB, rounded up
    ],
)
def test_memory_sizes_in_mib_rounded_up(written: str, mib: int) -> None:
    assert request(f"resources:\n  memory: {written}\n" + BASE)["memory_mib"] == mib


@pytest.mark.parametrize("written", ["32 gigs", "32G", "32gib", "-1", "lots", "1e3", "[32]", "1.0000001"])
def test_memory_mistakes(written: str) -> None:
    fault = refusal(f"resources:\n  memory: {written}\n" + BASE)
    assert (fault.line, fault.column) == (2, 11)


def test_memory_bounds() -> None:
    assert request("resources:\n  memory: 1024TiB\n" + BASE)["memory_mib"] == 1 << 30
    assert "more memory than any node" in refusal("resources:\n  memory: 2000000000TiB\n" + BASE).message
    assert request("resources:\n  gpu_memory: 80\n" + BASE)["gpu_memory_mib_min"] == 80 * 1024
    assert "more memory" in refusal("resources:\n  gpu_memory: 5000TiB\n" + BASE).message


@pytest.mark.parametrize(
    "written, size_bytes",
    [("512", 512), ("40GiB", 40 << 30), ("1.5KB", 1500), ("2MB", 2_000_000), ("0.5KiB", 512), ("'10+'", 10)],
)
def test_a_datasets_size_is_bytes_unless_it_names_a_unit(written: str, size_bytes: int) -> None:
    text = f"""\
        datasets:
          - url: https://h/x.tar
            digest: blake3:{"a" * 64}
            size: {written}
        """
    assert request(textwrap.dedent(text) + BASE)["datasets"][0]["size_bytes"] == size_bytes


@pytest.mark.parametrize(
    "written, seconds",
    [("90", 90), ("'90'", 90), ("90s", 90), ("15m", 900), ("12h", 43_200), ("2d", 172_800), ("30d", 2_592_000),
     ("1h30m", 5400), ("1d2h3m4s", 93_784), ("0h90s", 90)],
)  # fmt: skip
def test_durations(written: str, seconds: int) -> None:
    assert request(f"max_runtime: {written}\n" + BASE)["max_runtime_s"] == seconds


@pytest.mark.parametrize(
    "written", ["0", "31d", "1.5h", "12 hours", "1h 30m", "30m1h", "1h1h", "2H", "-5", "soon", "2w", "h", "[1h]"]
)
def test_duration_mistakes(written: str) -> None:
    fault = refusal(f"max_runtime: {written}\n" + BASE)
    assert (fault.line, fault.column) == (1, 14)


@pytest.mark.parametrize(
    "written, milli",
    [("4", 4000), ("0.5", 500), ("'4+'", 4000), ("1.234", 1234), ("0.001", 1), ("'2.25'", 2250), ("4.000", 4000)],
)
def test_cpus_are_thousandths(written: str, milli: int) -> None:
    assert request(f"resources:\n  cpus: {written}\n" + BASE)["cpu_milli"] == milli


@pytest.mark.parametrize("written", ["0", "0.0004", "1.2345", "-1", "four", "[4]", "1e3"])
def test_cpus_mistakes(written: str) -> None:
    fault = refusal(f"resources:\n  cpus: {written}\n" + BASE)
    assert (fault.line, fault.column) == (2, 9)


@pytest.mark.parametrize(
    "written, text",
    [("3.20", "3.2"), ("'$3.20'", "3.2"), ('"3.20"', "3.2"), ("3", "3"), ("1000", "1000"), ("0.000001", "0.000001"),
     ("2.500000", "2.5"), ("10.0", "10")],
)  # fmt: skip
def test_prices_in_normal_form(written: str, text: str) -> None:
    body = request(f"max_price: {written}\ntier: bronze\nruntime: process\nrun: echo\n")
    assert body["max_price_per_gpu_hour"] == text


@pytest.mark.parametrize("written", ["0", "-1", "1000.01", "1.1234567", "cheap", "true", "$", "[1]"])
def test_price_mistakes(written: str) -> None:
    fault = refusal(f"max_price: {written}\ntier: bronze\nruntime: process\nrun: echo\n")
    assert (fault.line, fault.column) == (1, 12)


# ---- the other keys


def test_envs_keep_each_scalars_text() -> None:
    env = request(
        textwrap.dedent(
            """\
        envs:
          A: 3.0
          B: yes
          C: 007
          D: "quoted"
          E: 1e3
          F: ~/home
          G: 'single'
          H: .inf
        """
        )
        + BASE
    )["env"]
    assert env == {
        "A": "3.0", "B": "yes", "C": "007", "D": "quoted", "E": "1e3", "F": "~/home", "G": "single", "H": ".inf",
    }  # fmt: skip


def test_envs_mistakes() -> None:
    fault = refusal("envs:\n  A:\n" + BASE)
    assert (fault.line, fault.column) == (2, 3)
    assert "has no value" in fault.message
    assert "is text, a number or true/false" in refusal("envs:\n  A: [1, 2]\n" + BASE).message
    # Names are the coordinator's to check.
    assert request("envs:\n  'A=B': 1\n" + BASE)["env"] == {"A=B": "1"}
    assert "is a mapping of keys" in refusal("envs: [A=1]\n" + BASE).message
    assert "given twice in envs" in refusal("envs:\n  A: 1\n  A: 2\n" + BASE).message


def test_a_scripts_setup_and_run() -> None:
    body = request("tier: bronze\nmax_price: 1\nruntime: process\nsetup: |\n  make\n\nrun: ./eval\n")
    assert body["image"] == "sh"
    assert body["command"] == ["-c", "set -e\nmake\nset +e\n./eval"]
    body = request("tier: bronze\nmax_price: 1\nresources:\n  image_id: alpine\nrun: echo hi\n")
    assert body["command"] == ["sh", "-c", "echo hi"]
    assert "runtime" not in body


def test_a_container_without_run_runs_its_images_command() -> None:
    body = request("tier: bronze\nmax_price: 1\nresources:\n  image_id: alpine\nruntime: container\n")
    assert body == {"image": "alpine", "tier": "bronze", "max_price_per_gpu_hour": "1", "runtime": "container"}


def test_what_runs_mistakes() -> None:
    fault = refusal("tier: bronze\nmax_price: 1\nruntime: process\n")
    assert (fault.line, fault.column) == (3, 1)
    assert "needs `run`" in fault.message
    assert "needs `run`" in refusal("tier: bronze\nmax_price: 1\nruntime: process\ncommand: []\n").message
    assert "is a list of words" in refusal("command: python train.py\n" + "tier: bronze\nmax_price: 1\n").message
    assert "is text, not a list" in refusal("tier: bronze\nmax_price: 1\nruntime: process\nrun: [a, b]\n").message


def test_what_the_file_leaves_out_may_be_given_beside_it(tmp_path: Path) -> None:
    # `tier`, `max_price` and an image may be left to flags (here: overrides); the coordinator
    # refuses a job without them.
    assert request("run: echo\n") == {"command": ["sh", "-c", "echo"]}
    assert request("runtime: container\n") == {"runtime": "container"}
    assert request("max_price: 1\nruntime: process\nrun: echo\n", tier="gold")["tier"] == "gold"
    path = tmp_path / "job.yaml"
    path.write_text("max_price: 1\nruntime: process\nrun: echo\nenvs: {A: 1}\n")
    job = load_job_file(path, tier="silver", env={"B": "2"}, name="given")
    assert (job.tier, job.env, job.name) == ("silver", {"A": "1", "B": "2"}, "given")
    with pytest.raises(TypeError):
        load_job_file(path, tier="silver", gpu=1)


def test_top_level_keys() -> None:
    body = request(
        textwrap.dedent(
            """\
        name: n
        num_nodes: 3
        preemptible: false
        class: training
        network: none
        client_token: "12345"
        reservation: 7
        checkpoint:
          dir: /data/ckpt
        gang:
          max_restarts: 100
        """
        )
        + BASE
    )
    assert body["replicas"] == 3 and body["preemptible"] is False and body["class"] == "training"
    assert body["network"] == "none" and body["client_token"] == "12345"
    assert body["reservation"] == 7
    assert body["checkpoint_dir"] == "/data/ckpt" and "checkpoint_interval_s" not in body
    assert body["max_restarts"] == 100 and "gang_repair" not in body


@pytest.mark.parametrize(
    "line, says",
    [
        ("num_nodes: 0", "is not in 1–4096"),
        ("num_nodes: 4097", "is not in 1–4096"),
        ("num_nodes: '2'", "is a whole number"),
        ("num_nodes: 2.0", "is a whole number"),
        ("reservation: 0", "is not in 1–"),
        ("reservation: next-tuesday", "is a whole number"),
        ("preemptible: yes", "is true or false, not `yes`"),
        ("preemptible: 1", "is true or false"),
        ("class: research", "is not one of training, inference, batch, eval"),
        ("network: host", "is not one of none, bridge"),
        ("runtime: vm", "is not one of container, process"),
        ("checkpoint: {dir: ckpt}", "is not an absolute path"),
        ("checkpoint: {interval: 0}", "is not from 1s"),
        ("checkpoint: /ckpt", "is a mapping of keys"),
        ("gang: {max_restarts: 101}", "is not in 0–100"),
        ("gang: {repair: rebuild}", "is not one of restart, keep"),
        ("gang: {repair_billing: free}", "is not one of bill, pause"),
        (
            "gang: {restarts: 1}",
            "unknown key `restarts` in gang; the keys here are repair, max_restarts, repair_billing",
        ),
        ("name: [a, b]", "is text, not a list"),
        ("name: {a: b}", "is text, not a mapping"),
        ("resources: H100:8", "is a mapping of keys"),
        ("datasets: {url: x}", "is a list of datasets"),
    ],
)
def test_top_level_mistakes(line: str, says: str) -> None:
    fault = refusal(line + "\n" + BASE)
    assert fault.line == 1, str(fault)
    assert says in fault.message, str(fault)


def test_resources_keys() -> None:
    body = request(
        """\
        resources:
          regions: [eu-west, eu-north]
          topology: node
          min_reliability: 1
          image_id: "docker:nvcr.io/nvidia/pytorch:24.10-py3"
        runtime: container
        tier: gold
        max_price: 3
        """
    )
    assert body["regions"] == ["eu-west", "eu-north"]
    assert body["topology"] == "node" and body["min_reliability"] == 1.0
    assert body["image"] == "nvcr.io/nvidia/pytorch:24.10-py3"
    for line, says in [
        ("  topology: rack", "is not one of node, nvlink"),
        ("  min_reliability: 1.5", "is not a fraction from 0 to 1"),
        ("  min_reliability: '0.9'", "is a number from 0 to 1"),
        ("  regions: {a: b}", "a region or a list"),
        ("  ports: 8080", "`ports` are a service's"),
    ]:
        fault = refusal("resources:\n" + line + "\n" + BASE)
        assert fault.line == 2 and says in fault.message, str(fault)


def test_datasets_mistakes() -> None:
    digest = "blake3:" + "a" * 64
    cases = [
        ("  - {url: https://h/x, digest: md5:00, size: 1}", "is not blake3:<64 hex> or sha256:<64 hex>"),
        (f"  - {{url: https://h/x, digest: {digest}}}", "a dataset needs `size`"),
        (f"  - {{url: https://h/x, digest: {digest}, size: 1, sha: 2}}", "unknown key `sha` in a dataset"),
        ("  - https://h/x,md5:00,1", "is not blake3"),
        (f"  - https://h/x,{digest}", "is not URL,DIGEST,SIZE_BYTES"),
        (f"  - https://h/x,{digest},1GiB", "is not URL,DIGEST,SIZE_BYTES"),
        ("  - [a, b]", "a dataset is a mapping"),
    ]
    for item, says in cases:
        fault = refusal("datasets:\n" + item + "\n" + BASE)
        assert fault.line == 2 and says in fault.message, str(fault)


# ---- SkyPilot's keys name Fallow's form


@pytest.mark.parametrize(
    "where, key, hint",
    [
        ("resources", "use_spot", "`tier: bronze`"),
        ("top", "use_spot", "`tier: bronze`"),
        ("top", "spot_recovery", "`tier: bronze`"),
        ("top", "job_recovery", "max_restarts"),
        ("resources", "region", "`regions: [REGION, …]` in resources"),
        ("resources", "zone", "`regions: [REGION, …]` in resources"),
        ("resources", "cloud", "`regions: [REGION, …]` in resources"),
        ("resources", "infra", "`regions: [REGION, …]` in resources"),
        ("top", "file_mounts", "`datasets`"),
        ("top", "storage_mounts", "`datasets`"),
        ("top", "workdir", "nothing is uploaded"),
        ("resources", "instance_type", "`accelerators`, `cpus` and `memory`"),
        ("resources", "disk_size", "not sold on its own"),
        ("resources", "disk_tier", "not sold on its own"),
        ("resources", "any_of", "alternatives in `accelerators`"),
        ("resources", "ordered", "alternatives in `accelerators`"),
        ("top", "image", "`image_id` in resources"),
        ("top", "env", "`envs`"),
        ("top", "secrets", "`envs`"),
        ("resources", "gpus", "`accelerators: MODEL:COUNT`"),
        ("top", "max_price_per_gpu_hour", "`max_price`"),
        ("resources", "port", "`ports` in resources"),
        ("top", "accelerators", "`accelerators` goes in `resources`"),
        ("top", "image_id", "`image_id` goes in `resources`"),
        ("resources", "tier", "`tier` goes at the top level"),
        ("resources", "num_nodes", "`num_nodes` goes at the top level"),
        ("top", "labels", "the keys here are name, resources, num_nodes"),
        ("resources", "labels", "the keys here are accelerators, compute_units"),
    ],
)
def test_skypilots_keys_name_fallows_form(where: str, key: str, hint: str) -> None:
    if where == "top":
        text, line, column, place = f"{key}: x\n" + BASE, 1, 1, "at the top level"
    else:
        text, line, column, place = f"resources:\n  {key}: x\n" + BASE, 2, 3, "in resources"
    fault = refusal(text)
    assert (fault.line, fault.column) == (line, column)
    assert fault.message.startswith(f"unknown key `{key}` {place}; "), fault.message
    assert hint in fault.message


def test_service_keys() -> None:
    service = parse_service_file(
        textwrap.dedent(
            """\
            name: web
            resources:
              accelerators: H100:0.1
              ports: [8000]
            tier: silver
            max_price: 4
            runtime: process
            run: exec python3 -m http.server "$PORT"
            service:
              readiness_probe:
                path: /ready
                initial_delay_seconds: 30
              replica_policy:
                min_replicas: 0
                max_replicas: 4
                target_in_flight: 8
                target_p95_ms: 250
                burst_tier: bronze
                upscale_delay_seconds: 5
                downscale_delay_seconds: 600
              wake_timeout: 45
            """
        ),
        "web.yaml",
    )
    assert service.to_dict() == {
        "name": "web",
        "replica": {
            "name": "web",
            "gpu_share_milli": 100,
            "gpu_models": ["H100"],
            "tier": "silver",
            "max_price_per_gpu_hour": "4",
            "runtime": "process",
            "image": "sh",
            "command": ["-c", 'exec python3 -m http.server "$PORT"'],
        },
        "port": 8000,
        "health_path": "/ready",
        "health_timeout_s": 30,
        "min_replicas": 0,
        "max_replicas": 4,
        "target_in_flight": 8,
        "target_p95_ms": 250,
        "burst_tier": "bronze",
        "scale_up_after_s": 5,
        "scale_down_after_s": 600,
        "wake_timeout_s": 45,
    }


@pytest.mark.parametrize(
    "section, says",
    [
        ("service:\n  replicas: 65", "is not in 0–64"),
        ("service:\n  replica_policy: {burst_tier: spot}", "is not one of gold, silver, bronze"),
        ("service:\n  readiness_probe: [/]", "is an HTTP path"),
        ("service:\n  readiness_probe: {path: /, timeout_seconds: 5}", "unknown key `timeout_seconds`"),
        ("service:\n  wake_timeout: 2d", "is not from 0s to 1d"),
        ("service:\n  autoscale: true", "unknown key `autoscale` in service"),
        ("service:\n  replica_policy: {base_ondemand_fallback_replicas: 1}", "`burst_tier`"),
        ("resources:\n  ports: [80, 81]\nservice: {}", "give one port"),
        ("resources:\n  ports: 70000\nservice: {}", "is not a port"),
    ],
)
def test_service_mistakes(section: str, says: str) -> None:
    fault = refusal("name: web\n" + BASE + section + "\n", service=True)
    assert says in fault.message, str(fault)


def test_a_service_needs_a_name() -> None:
    fault = refusal(BASE + "service:\n  replicas: 1\n", service=True)
    assert "has no name" in fault.message
    assert parse_service_file("name: a\n" + BASE).name == "a"


# ---- the YAML itself


def test_the_file_as_a_whole(tmp_path: Path) -> None:
    for text in ("", "\n\n", "# only a comment\n", "~\n", "---\n"):
        fault = refusal(text)
        assert (fault.line, fault.column) == (1, 1) and "empty" in fault.message
    for text in ("just text\n", "# a comment\n\n- a\n- b\n", "\n  - a\n"):
        fault = refusal(text)
        assert (fault.line, fault.column) == (1, 1) and "is a mapping of keys" in fault.message
    fault = refusal("tier: bronze\n---\ntier: gold\n")
    assert fault.message.startswith("not YAML")
    fault = refusal("tier: bronze\n  max_price: 2\n")
    assert (fault.line, fault.column) == (2, 12) and fault.message.startswith("not YAML")
    fault = refusal("resources:\n  cpus: 2\n  cpus: 3\n" + BASE)
    assert (fault.line, fault.column) == (3, 3) and "given twice in resources (first on line 2)" in fault.message
    fault = refusal("? [a, b]\n: 1\n" + BASE)
    assert "a key must be a word" in fault.message
    with pytest.raises(JobFileError) as caught:
        load_job_file(tmp_path / "missing.yaml")
    assert "cannot read" in caught.value.message
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (256 * 1024) + "\n")
    with pytest.raises(JobFileError) as caught:
        load_job_file(big)
    assert "over 262144 bytes" in caught.value.message


def test_anchors_and_aliases_are_read_as_their_values() -> None:
    body = request("envs:\n  A: &word hello\n  B: *word\n" + BASE)
    assert body["env"] == {"A": "hello", "B": "hello"}
