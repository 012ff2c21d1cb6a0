"""Bearer-token check and the loopback rule of docs/architecture.md ("Design rules": the status
API listens on 127.0.0.1 unless told otherwise, and then requires a token)."""

from __future__ import annotations

import ipaddress
import secrets

from fastapi import HTTPException, Request

__all__ = ["is_loopback", "require_token_off_loopback", "TokenCheck"]

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost: may resolve anywhere


def require_token_off_loopback(host: str, token: str | None) -> None:
    if not token and not is_loopback(host):
        raise ValueError(
            f"the status API would listen on {host!r}, which is not loopback, without a token; "
            "pass --status-token TOKEN (clients then send 'Authorization: Bearer TOKEN'), "
            "or keep --status-host 127.0.0.1"
        )


class TokenCheck:
    """FastAPI dependency: ``Authorization: Bearer <token>`` on every route but ``public``.

    The token is accepted in that header only, never in the query string (a URL ends up in
    access logs, proxies and browser history). ``public`` routes (the dashboard page: static
    HTML with no run data) need none; the page reads the token from its URL fragment
    (``#token=``, which a browser never sends) and streams ``/events`` with the header.
    """

    def __init__(self, token: str | None, public: frozenset[str] = frozenset()) -> None:
        self._token = token.encode() if token else None
        self._public = public

    def __call__(self, request: Request) -> None:
        if self._token is None or request.url.path in self._public:
            return
        given = None
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value:
            given = value.strip()
        if given is None or not secrets.compare_digest(given.encode(), self._token):
            raise HTTPException(
                status_code=401,
                detail="missing or wrong bearer token: send 'Authorization: Bearer <token>' "
                "(the token given to --status-token); a token in the URL is not accepted",
                headers={"WWW-Authenticate": "Bearer"},
            )
