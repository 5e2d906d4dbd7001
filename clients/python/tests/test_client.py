"""The client against a real `fallow dev` (one node, two simulated H100-SXM5, jobs run as
processes): submit, wait, logs, cancel, quote, offers, balance, exit codes, a job file, and the
API's refusals as `FallowError`."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict

import pytest

from fallow_client import Client, FallowError, JobRequest, JobView, ReservationView

from .conftest import Dev

#: How long a small job on dev may take from submission to its end.
WITHIN_S = 60.0


def shell(script: str, **fields: Any) -> JobRequest:
    """A bronze process job running `sh -c SCRIPT` on a tenth of a GPU."""
    values: Dict[str, Any] = {
        "name": "python-client-test",
        "image": "sh",
        "command": ["-c", script],
        "runtime": "process",
        "tier": "bronze",
        "max_price_per_gpu_hour": "2",
        "gpu_share_milli": 100,
        "max_runtime_s": 600,
    }
    values.update(fields)
    return JobRequest(**values)


def test_submit_wait_and_read_the_output(client: Client) -> None:
    job = client.submit(shell("echo hello from python; echo second line"))
    assert isinstance(job, JobView) and job.id > 0
    assert job.state in ("queued", "running")
    assert job.spec.image == "sh" and job.spec.runtime == "process"
    done = client.wait(job.id, timeout=WITHIN_S)
    assert done.state == "finished", done
    assert done.exit_code == 0 and done.exit_status() == 0
    assert done.leases and done.leases[-1].gpu_model == "H100-SXM5"
    assert done.leases[-1].exit_code == 0 and done.leases[-1].gpu_milli == 100
    text = client.log_text(job.id)
    assert text == "hello from python\nsecond line\n"
    chunks = list(client.logs(job.id, replica=0))
    assert "".join(chunk.text for chunk in chunks) == text
    assert all(chunk.replica == 0 for chunk in chunks)
    assert list(client.logs(job.id, replica=1)) == []


def test_a_replicas_output_archive_kept_by_the_coordinator(client: Client) -> None:
    import io
    import tarfile

    job = client.submit(shell('mkdir -p "$FALLOW_OUTPUT_DIR/sub" && echo 0.25 > "$FALLOW_OUTPUT_DIR/sub/loss.txt"'))
    done = client.wait(job.id, timeout=WITHIN_S)
    assert done.state == "finished", done
    output = done.leases[-1].output
    assert output is not None and output.kept and output.digest.startswith("blake3:"), done
    data = client.output(job.id)
    assert len(data) == output.size_bytes
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = archive.extractfile("sub/loss.txt")
        assert member is not None and member.read() == b"0.25\n"
    with pytest.raises(FallowError) as caught:
        client.output(job.id, replica=1)
    assert caught.value.status == 404


def test_logs_follow_the_output_as_it_comes_until_the_end(client: Client) -> None:
    job = client.submit(shell("for i in 1 2 3; do echo line $i; sleep 1; done"))
    seen = []
    for chunk in client.logs(job.id, follow=True, poll=0.2):
        seen.append((chunk.text, client.job(job.id).state))
    assert "".join(text for text, _ in seen) == "line 1\nline 2\nline 3\n"
    # Output came while the job ran, not only after it ended.
    assert seen[0][1] == "running", seen
    assert client.job(job.id).state == "finished"


def test_a_failing_jobs_exit_code(client: Client) -> None:
    job = client.submit(shell("echo failing >&2; exit 3"))
    done = client.wait(job.id, timeout=WITHIN_S)
    assert done.state == "failed"
    assert done.exit_code == 3 and done.exit_status() == 3
    assert "failing" in client.log_text(job.id)


def test_cancel_a_long_job(client: Client) -> None:
    job = client.submit(shell("echo started; sleep 300"))
    deadline = time.monotonic() + WITHIN_S
    while "started" not in client.log_text(job.id):
        assert time.monotonic() < deadline, client.job(job.id)
        time.sleep(0.3)
    assert client.job(job.id).state == "running"
    cancelled = client.cancel(job.id)
    assert cancelled.state == "cancelled"
    done = client.wait(job.id, timeout=WITHIN_S)
    assert done.state == "cancelled" and done.exit_status() == 130
    assert done.escrow_micros == 0


def test_quote(client: Client) -> None:
    fits = client.quote(shell("true", gpu_share_milli=None, gpus=1))
    assert fits.nodes_total >= 1 and fits.nodes_feasible == 1 and fits.gpus_feasible >= 1
    assert fits.price_micros_per_gpu_hour is not None and 0 < fits.price_micros_per_gpu_hour <= 2_000_000
    # A quote needs no image: any is quoted alike.
    too_big = client.quote({"tier": "gold", "max_price_per_gpu_hour": "10", "gpus": 8, "replicas": 2})
    assert too_big.nodes_feasible == 0 and too_big.price_micros_per_gpu_hour is None
    assert too_big.explanation


def test_offers(client: Client) -> None:
    everything = client.offers()
    assert everything.total_matching >= 1
    offer = everything.offers[0]
    assert offer.gpu_model == "H100-SXM5" and offer.gpu_count == 2 and offer.simulated and offer.online
    assert offer.compute_units > 0 and 0 <= offer.reliability <= 1
    assert set(offer.price_micros_per_gpu_hour) >= {"bronze", "silver", "gold"}
    assert client.offers("gpu_model=H100-SXM5", limit=1).offers[0].node_id == offer.node_id
    nothing = client.offers("region in [nowhere]")
    assert nothing.offers == [] and nothing.total_matching == 0
    assert nothing.explanation and "nowhere" in nothing.explanation


def test_the_balance_pays_for_a_job(client: Client) -> None:
    before = client.balance()
    assert before.account_id > 0 and before.available_micros > 0
    assert before.earnings_micros == 0 and before.bond_micros == 0
    job = client.submit(shell("sleep 6; echo done", gpu_share_milli=None, gpus=1))
    done = client.wait(job.id, timeout=WITHIN_S)
    assert done.state == "finished"
    deadline = time.monotonic() + WITHIN_S
    while client.job(job.id).cost_micros == 0:
        assert time.monotonic() < deadline, f"job {job.id} was never billed: {client.job(job.id)}"
        time.sleep(0.5)
    cost = client.job(job.id).cost_micros
    after = client.balance()
    assert after.account_id == before.account_id
    assert after.available_micros < before.available_micros
    assert before.available_micros - after.available_micros >= cost


def test_submit_a_job_file(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "hello.yaml"
    path.write_text(
        "name: from-a-file\n"
        "resources:\n"
        "  accelerators: H100-SXM5:0.1\n"
        "tier: bronze\n"
        "max_price: 2.00\n"
        "class: eval\n"
        "runtime: process\n"
        "envs:\n"
        "  GREETING: 3.0\n"
        "setup: echo setting up\n"
        "run: |\n"
        '  echo "greeting $GREETING"\n'
    )
    job = client.submit(path)
    assert job.spec.name == "from-a-file" and job.spec.class_ == "eval"
    assert job.spec.max_price_per_gpu_hour == "2" and job.spec.env == {"GREETING": "3.0"}
    done = client.wait(job.id, timeout=WITHIN_S)
    assert done.exit_status() == 0, done
    assert client.log_text(job.id) == "setting up\ngreeting 3.0\n"
    # A string is a path too, and a dict is the API's fields.
    assert client.submit(str(path)).spec.gpu_models == ["H100-SXM5"]
    by_dict = client.submit(shell("true").to_dict())
    assert client.wait(by_dict.id, timeout=WITHIN_S).state == "finished"


def test_book_ahead_list_show_and_cancel(client: Client) -> None:
    """Dev's two H100-SXM5 booked two days ahead: the whole price held, and all of it back on a
    cancellation more than a day ahead; a booking the node cannot meet is refused saying why.
    (The money's movements are the server's tests', on both backends.)"""
    starts_at = datetime.now(timezone.utc) + timedelta(days=2)
    with pytest.raises(FallowError) as refused:
        client.reserve(64, "H100", starts_at, hours=8, max_price="3")
    assert "cannot be met" in str(refused.value) and "64" in str(refused.value), str(refused.value)

    booked = client.reserve(2, "H100-SXM5", starts_at, hours=8, max_price="3")
    assert isinstance(booked, ReservationView) and booked.state == "booked", booked
    assert booked.gpus == 2 and booked.hold_micros > 0 and booked.escrow_micros == booked.hold_micros
    assert sum(node.gpus for node in booked.nodes) == 2 and booked.nodes[0].price_micros_per_gpu_hour <= 3_000_000
    assert booked.ends_at_us - booked.starts_at_us == 8 * 3_600 * 1_000_000
    assert booked.id in [item.id for item in client.reservations().reservations]
    assert client.reservation(booked.id).refund_if_cancelled_micros == booked.hold_micros

    cancelled = client.cancel_reservation(booked.id)
    assert cancelled.state == "cancelled" and cancelled.escrow_micros == 0, cancelled


def test_a_linked_own_provider_runs_the_job_unpriced(client: Client, dev: Dev) -> None:
    """Dev's demo provider linked as the tenant's own: its node runs the tenant's job at no
    price (`capacity` "own"); unlinked, the next job buys it on the market."""
    with pytest.raises(FallowError):
        client.link_own_provider("not-a-key")
    provider_key = (dev.data_dir / "provider.key").read_text()
    linked = client.link_own_provider(provider_key)
    try:
        assert len(linked.providers) == 1, linked
        own = linked.providers[0]
        assert own.nodes == 1 and own.gpus == 2, own
        assert client.own_providers() == linked
        assert client.quote(shell("echo own")).own_nodes_feasible == 1
        job = client.wait(client.submit(shell("echo own")).id, timeout=WITHIN_S)
        assert job.state == "finished" and job.capacity == "own", job
        assert job.leases[-1].price_micros_per_gpu_hour == 0, job
    finally:
        after = client.unlink_own_provider(linked.providers[0].provider_id if linked.providers else 0)
    assert after.providers == [], after
    assert client.quote(shell("echo market")).own_nodes_feasible is None
    job = client.wait(client.submit(shell("echo market")).id, timeout=WITHIN_S)
    assert job.capacity == "market", job


def test_list_jobs(client: Client) -> None:
    job = client.submit(shell("true", name="listed"))
    client.wait(job.id, timeout=WITHIN_S)
    page = client.jobs(limit=500)
    assert page.jobs[0].id == job.id  # newest first
    finished = client.jobs(state="finished", since=timedelta(minutes=30), limit=500)
    assert job.id in [listed.id for listed in finished.jobs]
    assert all(listed.state == "finished" for listed in finished.jobs)
    assert client.jobs(state="queued", since=timedelta(seconds=-3600)).jobs == []
    first = client.jobs(limit=1)
    assert len(first.jobs) == 1 and first.next_before is not None
    second = client.jobs(limit=1, before=first.next_before)
    assert second.jobs[0].id < first.jobs[0].id


def test_refusals_raise_with_the_servers_words(client: Client, dev: Dev) -> None:
    with pytest.raises(FallowError) as caught:
        client.job(987654)
    assert caught.value.status == 404 and caught.value.code == "not_found"
    with pytest.raises(FallowError) as caught:
        client.submit(shell("true", tier="platinum"))
    assert caught.value.status == 400 and caught.value.code == "bad_request"
    assert "tier" in caught.value.message and "platinum" in caught.value.message
    with pytest.raises(FallowError) as caught:
        client.submit({"image": "sh", "tier": "bronze", "max_price_per_gpu_hour": "2", "gpu": 1})
    assert caught.value.status in (400, 422), caught.value
    with Client(dev.url, "fallow_not_a_key") as stranger:
        with pytest.raises(FallowError) as caught:
            stranger.balance()
    assert caught.value.status == 401
    with Client("http://127.0.0.1:9", dev.key) as nowhere:
        with pytest.raises(FallowError) as caught:
            nowhere.balance()
    assert caught.value.status is None and "cannot reach" in caught.value.message


def test_the_environment_names_the_coordinator(dev: Dev, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FALLOW_URL", dev.url)
    monkeypatch.setenv("FALLOW_API_KEY", dev.key)
    with Client() as client:
        assert client.url == dev.url and client.balance().available_micros > 0
    monkeypatch.delenv("FALLOW_URL")
    with Client() as client:
        assert client.url == "http://127.0.0.1:7070"


def test_the_routes_and_fields_are_the_documents(client: Client) -> None:
    """Each call's route is the OpenAPI document's, and each dataclass has the schema's fields."""
    document = client.openapi()
    operations = {
        operation["operationId"]: (method, path)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
        if isinstance(operation, dict) and "operationId" in operation
    }
    assert operations["submitJob"] == ("post", "/v1/jobs")
    assert operations["getJob"] == ("get", "/v1/jobs/{id}")
    assert operations["listJobs"] == ("get", "/v1/jobs")
    assert operations["getJobLogs"] == ("get", "/v1/jobs/{id}/logs")
    assert operations["getJobOutput"] == ("get", "/v1/jobs/{id}/output")
    assert operations["cancelJob"] == ("post", "/v1/jobs/{id}/cancel")
    assert operations["quoteJob"] == ("post", "/v1/jobs/quote")
    assert operations["searchOffers"] == ("get", "/v1/offers")
    assert operations["getBalance"] == ("get", "/v1/balance")
    assert operations["createReservation"] == ("post", "/v1/reservations")
    assert operations["listReservations"] == ("get", "/v1/reservations")
    assert operations["getReservation"] == ("get", "/v1/reservations/{id}")
    assert operations["cancelReservation"] == ("post", "/v1/reservations/{id}/cancel")
    assert operations["linkOwnProvider"] == ("post", "/v1/own-providers")
    assert operations["listOwnProviders"] == ("get", "/v1/own-providers")
    assert operations["unlinkOwnProvider"] == ("delete", "/v1/own-providers/{id}")
    import dataclasses

    import fallow_client as fc

    schemas = document["components"]["schemas"]
    for name, cls in [
        ("JobRequest", fc.JobRequest),
        ("JobView", fc.JobView),
        ("LeaseView", fc.LeaseView),
        ("OutputView", fc.OutputView),
        ("JobList", fc.JobList),
        ("JobLogs", fc.JobLogs),
        ("LogChunkView", fc.LogChunk),
        ("QuoteView", fc.QuoteView),
        ("OfferView", fc.OfferView),
        ("OfferList", fc.OfferList),
        ("BalanceView", fc.BalanceView),
        ("ProgressView", fc.ProgressView),
        ("DatasetRequest", fc.DatasetRequest),
        ("ServiceRequest", fc.ServiceRequest),
        ("ServeSpec", fc.ServeSpec),
        ("ReservationRequest", fc.ReservationRequest),
        ("ReservationView", fc.ReservationView),
        ("ReservationNodeView", fc.ReservationNodeView),
        ("ReservationList", fc.ReservationList),
        ("OwnProviderView", fc.OwnProviderView),
        ("OwnProviderList", fc.OwnProviderList),
    ]:
        fields = {item.metadata.get("wire", item.name) for item in dataclasses.fields(cls)}
        assert fields == set(schemas[name]["properties"]), name
