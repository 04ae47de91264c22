"""Errors the model server answers with, each carrying its HTTP status and vLLM error type."""

from __future__ import annotations

from typing import Any

from nemogym_sdk.errors import NemoGymError

__all__ = ["BadRequestError", "NotFoundError", "ServeError", "error_body"]


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
