"""OpenAI-style error envelope for every HTTP error: ``{"error": {"message", "type", "code"}}``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["error_response", "install_error_handlers"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    422: "invalid_request_error",
    503: "service_unavailable",
}


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    err_type = _TYPES.get(status, "internal_error" if status >= 500 else "invalid_request_error")
    return JSONResponse(
        {"error": {"message": message, "type": err_type, "code": status}},
        status_code=status,
        headers=headers,
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, str(exc.errors()))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}")
