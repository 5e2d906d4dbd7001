"""The wire types: JSON in and out, and a job's end as an exit status (docs/decisions.md, "A
job's end as an exit status"; the CLI's `JobExit`)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Dict, List, Optional

import pytest

from fallow_client import (
    DatasetRequest,
    JobRequest,
    JobView,
    LeaseView,
    OfferList,
    decimal_text,
    dollars,
    exit_status,
)


def job(state: str, exit_code: Optional[int] = None, leases: Optional[List[Dict[str, Any]]] = None) -> JobView:
    return JobView.from_dict({"id": 7, "state": state, "exit_code": exit_code, "leases": leases or []})


def lease(lease_id: int, state: str, ended_at_us: Optional[int]) -> Dict[str, Any]:
    return {"id": lease_id, "state": state, "ended_at_us": ended_at_us}


@pytest.mark.parametrize(
    "view, status",
    [
        (job("finished", 0, [lease(1, "finished", 10)]), 0),
        # The job's own code, as a shell sees it: its low byte, 1 where that byte is 0.
        (job("failed", 3, [lease(1, "failed", 10)]), 3),
        (job("failed", 255, [lease(1, "failed", 10)]), 255),
        (job("failed", 256, [lease(1, "failed", 10)]), 1),
        (job("failed", 259, [lease(1, "failed", 10)]), 3),
        (job("failed", -1, [lease(1, "failed", 10)]), 255),
        # A failure without a code: a node lost.
        (job("failed", None, [lease(1, "lost", 10)]), 1),
        # Never placed.
        (job("failed", None, []), 69),
        # The last lease (by end time, then id) preempted and not run again.
        (job("failed", None, [lease(1, "failed", 5), lease(2, "preempted", 10)]), 75),
        (job("failed", None, [lease(2, "preempted", 5), lease(1, "failed", 10)]), 1),
        (job("failed", None, [lease(1, "preempted", 10), lease(2, "preempted", None)]), 75),
        (job("failed", None, [lease(3, "failed", 10), lease(2, "preempted", 10)]), 1),
        # Cancelled, whatever its leases said.
        (job("cancelled", None, [lease(1, "preempted", 10)]), 130),
        (job("cancelled", 0, []), 130),
        # Not ended: no status yet.
        (job("queued"), None),
        (job("running", None, [lease(1, "running", None)]), None),
    ],
)
def test_a_jobs_end_as_an_exit_status(view: JobView, status: Optional[int]) -> None:
    assert view.exit_status() == status
    assert exit_status(view) == status
    assert view.ended == (status is not None)


def test_a_requests_body_has_the_fields_given() -> None:
    request = JobRequest(
        image="sh",
        command=["-c", "echo hi"],
        tier="bronze",
        max_price_per_gpu_hour=Decimal("2.50"),
        compute_units=1.5,
        class_="eval",
        datasets=[DatasetRequest(url="https://h/x", digest="blake3:" + "0" * 64, size_bytes=1)],
    )
    assert request.to_dict() == {
        "image": "sh",
        "command": ["-c", "echo hi"],
        "tier": "bronze",
        "max_price_per_gpu_hour": "2.5",
        "compute_units": "1.5",
        "class": "eval",
        "datasets": [{"url": "https://h/x", "digest": "blake3:" + "0" * 64, "size_bytes": 1}],
    }
    assert JobRequest.from_dict(request.to_dict()).to_dict() == request.to_dict()
    assert JobRequest(max_price_per_gpu_hour=3).to_dict() == {"max_price_per_gpu_hour": "3"}


def test_answers_parse_with_nested_types_and_ignore_new_fields() -> None:
    view = JobView.from_dict(
        {
            "id": 1,
            "state": "finished",
            "spec": {"image": "sh", "class": "batch", "max_price_per_gpu_hour": "2", "gpus": None},
            "leases": [{"id": 2, "job_id": 1, "gpu_indices": [0, 1], "exit_code": 0, "some_new_field": 1}],
            "progress": {"unit": "tokens", "done": 5, "cost_micros_per_million_units": 9},
            "a_field_from_a_newer_coordinator": True,
        }
    )
    assert isinstance(view.spec, JobRequest) and view.spec.class_ == "batch" and view.spec.gpus is None
    assert isinstance(view.leases[0], LeaseView) and view.leases[0].gpu_indices == [0, 1]
    assert view.progress is not None and view.progress.done == 5
    offers = OfferList.from_dict({"offers": [{"node_id": 3, "price_micros_per_gpu_hour": {"bronze": 1}}]})
    assert offers.offers[0].price_micros_per_gpu_hour == {"bronze": 1}
    with pytest.raises(ValueError, match="unknown field `gpu`"):
        JobRequest.from_dict({"gpu": 1}, strict=True)


@pytest.mark.parametrize(
    "value, text",
    [("3.20", "3.2"), ("$3.20", "3.2"), (3, "3"), (3.0, "3"), (Decimal("10.500"), "10.5"), (1e-6, "0.000001"),
     ("100", "100"), ("0.0", "0")],
)  # fmt: skip
def test_decimal_text(value: Any, text: str) -> None:
    assert decimal_text(value) == text


def test_dollars() -> None:
    assert dollars(1_234_500) == Decimal("1.2345")
    assert dollars(-5) == Decimal("-0.000005")
