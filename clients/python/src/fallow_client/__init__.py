"""Fallow's Python client: the coordinator's API for tenants (`Client`), its bodies as
dataclasses, and the job file loader (docs/job-files.md).

    from fallow_client import Client, load_job_file

    with Client() as fallow:                      # FALLOW_URL, FALLOW_API_KEY
        job = fallow.submit("train.yaml")
        done = fallow.wait(job.id)
        print(done.state, done.exit_status(), fallow.log_text(job.id))
"""

from .client import DEFAULT_URL, Client
from .errors import FallowError, JobFileError
from .jobfile import load_job_file, load_service_file, parse_job_file, parse_service_file
from .types import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_NEVER_PLACED,
    EXIT_PREEMPTED,
    BalanceView,
    ClientRequest,
    DatasetRequest,
    JobList,
    JobLogs,
    JobRequest,
    JobView,
    LeaseView,
    LogChunk,
    OfferList,
    OfferView,
    OutputView,
    OwnProviderList,
    OwnProviderView,
    ProgressView,
    QuoteView,
    ReservationList,
    ReservationNodeView,
    ReservationRequest,
    ReservationView,
    ServeSpec,
    ServiceRequest,
    decimal_text,
    dollars,
    exit_status,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_URL",
    "EXIT_CANCELLED",
    "EXIT_FAILED",
    "EXIT_NEVER_PLACED",
    "EXIT_PREEMPTED",
    "BalanceView",
    "Client",
    "ClientRequest",
    "DatasetRequest",
    "FallowError",
    "JobFileError",
    "JobList",
    "JobLogs",
    "JobRequest",
    "JobView",
    "LeaseView",
    "LogChunk",
    "OfferList",
    "OfferView",
    "OutputView",
    "OwnProviderList",
    "OwnProviderView",
    "ProgressView",
    "QuoteView",
    "ReservationList",
    "ReservationNodeView",
    "ReservationRequest",
    "ReservationView",
    "ServeSpec",
    "ServiceRequest",
    "decimal_text",
    "dollars",
    "exit_status",
    "load_job_file",
    "load_service_file",
    "parse_job_file",
    "parse_service_file",
]
