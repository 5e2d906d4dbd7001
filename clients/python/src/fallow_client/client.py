"""A synchronous client of the coordinator's API over httpx: a tenant submits, follows, cancels
and quotes jobs, searches offers and reads its balance. The routes are those of
`/v1/openapi.json` (`crates/server/src/openapi/paths.rs`)."""

from __future__ import annotations

import ipaddress
import os
import random
import time
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from decimal import Decimal
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union
from urllib.parse import urlsplit

import httpx

from .errors import FallowError
from .jobfile import load_job_file
from .types import (
    BalanceView,
    JobList,
    JobLogs,
    JobRequest,
    JobView,
    LogChunk,
    OfferList,
    OwnProviderList,
    QuoteView,
    ReservationList,
    ReservationRequest,
    ReservationView,
)

#: The coordinator a client talks to when nothing else says (as the CLI).
DEFAULT_URL = "http://127.0.0.1:7070"
#: The longest one request may take; `wait` and `logs(follow=True)` poll, never block.
REQUEST_TIMEOUT_S = 30.0
#: Tries of one request while the coordinator cannot be reached or says to come back later
#: (429; 503 for requests safe to send twice), with backoff between them (as the CLI).
REQUEST_ATTEMPTS_MAX = 5
#: How often `wait` and `logs(follow=True)` ask again, seconds.
POLL_S = 0.5
#: Log chunks asked for per request (the API's page size limit).
LOG_PAGE = 500

JobLike = Union[JobRequest, Mapping[str, Any], str, "os.PathLike[str]"]


class Client:
    """The coordinator's API as a tenant sees it.

    `url` defaults to `FALLOW_URL`, else http://127.0.0.1:7070; `api_key` to `FALLOW_API_KEY`
    (`fallow dev --data-dir D` writes the demo tenant's to D/tenant.key). Every refusal or
    failure of the coordinator raises `FallowError`.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: float = REQUEST_TIMEOUT_S,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        url = (url or os.environ.get("FALLOW_URL") or DEFAULT_URL).strip()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{url!r} is not an http:// or https:// URL; give one like {DEFAULT_URL}")
        self.url = url.rstrip("/")
        key = api_key if api_key is not None else os.environ.get("FALLOW_API_KEY")
        self.api_key = key.strip() if key else None
        headers = {"User-Agent": "fallow-client-python"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self._http = httpx.Client(
            base_url=self.url + "/",
            headers=headers,
            timeout=timeout,
            transport=transport,
            # A proxy from the environment cannot reach this machine's loopback.
            trust_env=not _is_loopback(parts.hostname or ""),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- jobs

    def submit(self, job: JobLike) -> JobView:
        """Submits a job: a `JobRequest`, a dict of the API's fields, or the path of a job file
        (docs/job-files.md). Returns the job as stored (state "queued")."""
        return JobView.from_dict(self._request("POST", "/v1/jobs", body=_job_body(job)))

    def job(self, job_id: int) -> JobView:
        """One of your jobs with its leases, cost and, once it ended, its exit code."""
        return JobView.from_dict(self._request("GET", f"/v1/jobs/{int(job_id)}"))

    def jobs(
        self,
        state: Optional[str] = None,
        since: Union[None, datetime, timedelta, int] = None,
        limit: int = 50,
        before: Optional[int] = None,
    ) -> JobList:
        """A page of your jobs, newest first. `state`: queued, running, finished, failed or
        cancelled; `since`: jobs submitted at or after a time (a datetime; a naive one is UTC), a
        stretch back from now (a timedelta), or microseconds since the Unix epoch; `before`: the
        previous page's `next_before`."""
        query: Dict[str, Any] = {"limit": limit}
        if state is not None:
            query["state"] = state
        if since is not None:
            query["since_us"] = _since_us(since)
        if before is not None:
            query["before"] = before
        return JobList.from_dict(self._request("GET", "/v1/jobs", query=query))

    def wait(self, job_id: int, timeout: Optional[float] = None, poll: float = POLL_S) -> JobView:
        """Polls a job until it ends (finished, failed or cancelled) and returns it; its
        `exit_status()` is what `fallow job submit --wait` exits with. Raises `TimeoutError`
        when `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.ended:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job.state} after {timeout} s")
            pause = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            time.sleep(pause)

    def logs(
        self, job_id: int, follow: bool = False, replica: Optional[int] = None, poll: float = POLL_S
    ) -> Iterator[LogChunk]:
        """A job's output, oldest first, as chunks (`chunk.text`, `chunk.replica`). With
        `follow`, keeps yielding new output as it comes until the job ends (the API has no
        long-poll for logs: this polls every `poll` seconds). `replica`: only that replica's."""
        path = f"/v1/jobs/{int(job_id)}/logs"
        after = 0
        ending = False
        while True:
            page = JobLogs.from_dict(self._request("GET", path, query={"after": after, "limit": LOG_PAGE}))
            after = page.next_after
            for chunk in page.chunks:
                if replica is None or chunk.replica == replica:
                    yield chunk
            if len(page.chunks) == LOG_PAGE:
                continue
            if not follow or ending:
                return
            # A job's last output may land just before it ends: read once more after the end.
            if self.job(job_id).ended:
                ending = True
                continue
            time.sleep(poll)

    def log_text(self, job_id: int, replica: Optional[int] = None) -> str:
        """A job's output so far as one text (every replica's, or one's)."""
        return "".join(chunk.text for chunk in self.logs(job_id, replica=replica))

    def output(self, job_id: int, replica: int = 0) -> bytes:
        """The tar archive of what replica `replica` left in `$FALLOW_OUTPUT_DIR`, as the
        coordinator keeps it (a replica without an `output_url`); `tarfile.open(fileobj=
        io.BytesIO(data))` reads it. Its digest is the lease's `output.digest` in `job()`."""
        data: bytes = self._request("GET", f"/v1/jobs/{int(job_id)}/output", query={"replica": replica}, raw=True)
        return data

    def cancel(self, job_id: int) -> JobView:
        """Cancels a job: its replicas are stopped and its escrow released."""
        return JobView.from_dict(self._request("POST", f"/v1/jobs/{int(job_id)}/cancel"))

    def quote(self, job: JobLike) -> QuoteView:
        """What a job would clear at now, and how many nodes and GPUs could take it (submits
        nothing). A job without an image is quoted as any image would be."""
        body = _job_body(job)
        body.setdefault("image", "quote")
        return QuoteView.from_dict(self._request("POST", "/v1/jobs/quote", body=body))

    # ---- the market and money

    def offers(self, filter: str = "", limit: int = 100) -> OfferList:
        """Offers matching a filter, cheapest first, e.g.
        `"gpu_model=H100-SXM5 price<2.5 region in [eu-west,eu-north] tier=silver"`."""
        return OfferList.from_dict(self._request("GET", "/v1/offers", query={"filter": filter, "limit": limit}))

    def balance(self, account_id: Optional[int] = None) -> BalanceView:
        """Your balances in micro-dollars: available, in escrow, earned, bonded (admins:
        another account's)."""
        query = {} if account_id is None else {"account_id": account_id}
        return BalanceView.from_dict(self._request("GET", "/v1/balance", query=query))

    # ---- booking ahead (docs/reservations.md)

    def reserve(
        self,
        gpus: int,
        gpu_model: str,
        starts_at: Union[datetime, int],
        hours: int,
        max_price: Union[str, int, float, Decimal],
        regions: Optional[Sequence[str]] = None,
        topology: Optional[str] = None,
    ) -> ReservationView:
        """Books `gpus` whole GPUs of `gpu_model` from `starts_at` (a datetime, naive read as
        UTC, or µs since the epoch) for `hours`, at most `max_price` dollars per GPU-hour: the
        price is fixed now and the whole of it held. A booking the fleet cannot meet raises
        `FallowError` saying why. Jobs run inside it with `JobRequest(reservation=ID)`."""
        request = ReservationRequest(
            gpus=gpus,
            gpu_model=gpu_model,
            starts_at_us=_since_us(starts_at),
            hours=hours,
            max_price_per_gpu_hour=max_price,
            regions=list(regions) if regions is not None else None,
            topology=topology,
        )
        return ReservationView.from_dict(self._request("POST", "/v1/reservations", body=request.to_dict()))

    def reservations(self) -> ReservationList:
        """Your bookings, newest first."""
        return ReservationList.from_dict(self._request("GET", "/v1/reservations"))

    def reservation(self, reservation_id: int) -> ReservationView:
        """One booking: its nodes, prices, what is held and what a cancellation gives back."""
        return ReservationView.from_dict(self._request("GET", f"/v1/reservations/{int(reservation_id)}"))

    def cancel_reservation(self, reservation_id: int) -> ReservationView:
        """Cancels a booking: all back a day or more ahead, later half of what is undelivered."""
        return ReservationView.from_dict(self._request("POST", f"/v1/reservations/{int(reservation_id)}/cancel"))

    # ---- hybrid: nodes of your own organisation first

    def link_own_provider(self, provider_key: str) -> OwnProviderList:
        """Links a provider account of your own organisation, proven by one of its API keys
        (checked, not kept): your jobs then run on its nodes first, at no market price, and go
        to the market only when they do not fit there. `JobView.capacity` says which."""
        return OwnProviderList.from_dict(
            self._request("POST", "/v1/own-providers", body={"provider_key": provider_key.strip()})
        )

    def own_providers(self) -> OwnProviderList:
        """The provider accounts you linked, with their nodes and GPUs now."""
        return OwnProviderList.from_dict(self._request("GET", "/v1/own-providers"))

    def unlink_own_provider(self, provider_id: int) -> OwnProviderList:
        """Unlinks one: your jobs buy its nodes' time on the market again."""
        return OwnProviderList.from_dict(self._request("DELETE", f"/v1/own-providers/{int(provider_id)}"))

    def health(self) -> Dict[str, Any]:
        """The coordinator's liveness answer."""
        answer: Dict[str, Any] = self._request("GET", "/v1/health")
        return answer

    def openapi(self) -> Dict[str, Any]:
        """The API's OpenAPI document."""
        document: Dict[str, Any] = self._request("GET", "/v1/openapi.json")
        return document

    # ---- the wire

    def _request(
        self,
        method: str,
        path: str,
        query: Optional[Dict[str, Any]] = None,
        body: Optional[Dict[str, Any]] = None,
        raw: bool = False,
    ) -> Any:
        """Sends one request and returns the answer's JSON (None for an empty answer; its bytes
        when `raw`), asking again after a wait while the coordinator cannot be reached, says 429,
        or says 503 to a request safe to send twice."""
        attempt = 1
        while True:
            try:
                response = self._http.request(method, path.lstrip("/"), params=query, json=body)
            except httpx.ConnectError as error:
                if attempt < REQUEST_ATTEMPTS_MAX:
                    self._back_off(attempt, None)
                    attempt += 1
                    continue
                raise FallowError(
                    f"cannot reach the coordinator at {self.url} ({error}); start one (`fallow dev` for a demo "
                    "market) or set FALLOW_URL"
                ) from error
            except httpx.TimeoutException as error:
                raise FallowError(f"the coordinator at {self.url} did not answer {method} {path} in time") from error
            except httpx.HTTPError as error:
                raise FallowError(f"{method} {path} to {self.url}: {error}") from error
            again = response.status_code == 429 or (
                response.status_code == 503 and method in ("GET", "HEAD", "PUT", "DELETE", "OPTIONS")
            )
            if again and attempt < REQUEST_ATTEMPTS_MAX:
                self._back_off(attempt, response.headers.get("Retry-After"))
                attempt += 1
                continue
            if raw and response.is_success:
                return response.content
            return self._answer(method, path, response)

    def _answer(self, method: str, path: str, response: httpx.Response) -> Any:
        if response.is_success:
            if not response.content.strip():
                return None
            try:
                return response.json()
            except ValueError:
                raise FallowError(
                    f"the answer to {method} {path} is not JSON; is {self.url} a Fallow coordinator?",
                    response.status_code,
                ) from None
        code, message = "", response.text.strip() or response.reason_phrase
        try:
            detail = response.json()["error"]
            code, message = str(detail.get("code", "")), str(detail["message"])
        except (ValueError, KeyError, TypeError):
            pass
        if response.status_code == 401 and not self.api_key:
            message += " (no API key: set FALLOW_API_KEY or pass api_key=…)"
        raise FallowError(message, response.status_code, code)

    @staticmethod
    def _back_off(attempt: int, retry_after: Optional[str]) -> None:
        """Full jitter over an exponential ceiling (0.25 s doubling, at most 8 s), with the
        coordinator's `Retry-After` as a floor."""
        ceiling = min(8.0, 0.25 * 2 ** (attempt - 1))
        wait = random.uniform(0, ceiling)
        floor = _retry_after_s(retry_after)
        time.sleep(max(wait, floor))


def _job_body(job: JobLike) -> Dict[str, Any]:
    if isinstance(job, JobRequest):
        return job.to_dict()
    if isinstance(job, Mapping):
        return dict(job)
    if isinstance(job, (str, os.PathLike)):
        return load_job_file(job).to_dict()
    raise TypeError(f"a job is a JobRequest, a dict of the API's fields or a job file's path, not {type(job).__name__}")


def _since_us(since: Union[datetime, timedelta, int]) -> int:
    if isinstance(since, timedelta):
        since = datetime.now(timezone.utc) - since
    if isinstance(since, datetime):
        if since.tzinfo is None:
            since = since.replace(tzinfo=timezone.utc)
        return int(since.timestamp() * 1_000_000)
    return int(since)


def _retry_after_s(value: Optional[str]) -> float:
    if not value:
        return 0.0
    try:
        return max(0.0, min(60.0, float(value)))
    except ValueError:
        pass
    try:
        at = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, min(60.0, (at - datetime.now(timezone.utc)).total_seconds()))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


__all__ = ["Client", "DEFAULT_URL"]
