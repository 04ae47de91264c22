"""Errors the model server answers with, each carrying its HTTP status and vLLM error type."""

from __future__ import annotations

from typing import Any

from nemogym_sdk.errors import NemoGymError

__all__ = [
    "BadGatewayError",
    "BadRequestError",
    "NotFoundError",
    "ServeError",
    "UpstreamError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
    "error_body",
]


class ServeError(NemoGymError):
    """An error answered as an OpenAI/vLLM-shaped JSON error body."""

    status: int = 500
    err_type: str = "InternalServerError"

    def __init__(
        self, message: str, *, param: str | None = None, err_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if err_type is not None:
            self.err_type = err_type


class BadRequestError(ServeError, ValueError):
    """The request is invalid (HTTP 400)."""

    status = 400
    err_type = "BadRequestError"


class NotFoundError(ServeError, LookupError):
    """A model, adapter or file named by the request does not exist (HTTP 404)."""

    status = 404
    err_type = "NotFoundError"


def error_body(error: ServeError) -> dict[str, Any]:
    """Return vLLM's error JSON: ``{"error": {"message", "type", "param", "code"}}``."""
    return {
        "error": {
            "message": error.message,
            "type": error.err_type,
            "param": error.param,
            "code": error.status,
        }
    }


class UpstreamError(ServeError):
    """The vLLM server behind the proxy answered with an error; its status and message kept."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        param: str | None = None,
        err_type: str | None = None,
    ) -> None:
        super().__init__(message, param=param, err_type=err_type or _ERROR_TYPES.get(status))
        self.status = status


class BadGatewayError(ServeError):
    """The vLLM server's answer is not what the proxy needs (HTTP 502)."""

    status = 502
    err_type = "BadGateway"


class UpstreamUnavailableError(ServeError, ConnectionError):
    """The vLLM server cannot be reached (HTTP 503)."""

    status = 503
    err_type = "ServiceUnavailable"


class UpstreamTimeoutError(ServeError, TimeoutError):
    """The vLLM server did not answer in time (HTTP 504)."""

    status = 504
    err_type = "GatewayTimeout"


_ERROR_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFoundError",
    422: "BadRequestError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailable",
}
