"""The two errors the client raises: a refusal or failure of the coordinator, and a fault in a
job file."""

from typing import Optional


class FallowError(Exception):
    """The coordinator refused or failed a request, or could not be reached.

    `status` is the HTTP status (None when no answer came: the coordinator could not be reached
    or did not answer in time), `code` the API's stable code (`bad_request`, `unauthorized`,
    `payment_required`, `not_found`, `conflict`, …; empty when the answer was not the API's
    error body), and `message` what is wrong, in the coordinator's words.
    """

    def __init__(self, message: str, status: Optional[int] = None, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        code = f" {self.code}" if self.code else ""
        return f"{self.status}{code}: {self.message}"


class JobFileError(ValueError):
    """A fault in a job file, at a 1-based line and column of the offending key or value.

    Its text is `PATH:LINE:COLUMN: message`, as the CLI prints it.
    """

    def __init__(self, path: str, line: int, column: int, message: str) -> None:
        super().__init__(f"{path}:{line}:{column}: {message}")
        self.path = path
        self.line = line
        self.column = column
        self.message = message
