"""The status API's token rules for the explorer (``hallulog.api.auth``), plus a session for a
browser, which cannot put a header on the links it follows.

- Off loopback a token is required (``require_token_off_loopback``, naming ``--token``).
- The token travels in ``Authorization: Bearer`` only, never in a URL: ``/login`` is a static
  page without run data, opened as ``/login#token=TOKEN`` (a fragment never leaves the
  browser); its script sends the token once, as that header, to ``POST /session``, which sets a
  session cookie and the page goes on to ``./``.
- The cookie holds no token: it is an HMAC of the token under a key drawn at start-up, so it
  dies with the server, and it is ``HttpOnly`` and ``SameSite=Strict``. Every other route
  takes either that cookie or the bearer header (``TokenCheck``), else answers 401.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fastapi import Request, Response
from hallulog.api.auth import TokenCheck, is_loopback

__all__ = ["ViewAuth", "SESSION_COOKIE", "PUBLIC_PATHS", "require_token_off_loopback"]

SESSION_COOKIE = "hallulog_view_session"
PUBLIC_PATHS = frozenset({"/login", "/session"})


def require_token_off_loopback(host: str, token: str | None) -> None:
    """The status API's rule, naming the explorer's flag."""
    if not token and not is_loopback(host):
        raise ValueError(
            f"hallulog view would listen on {host!r}, which is not loopback, without a token; "
            "pass --token TOKEN (or set $HALLULOG_VIEW_TOKEN), or keep --host 127.0.0.1"
        )


class ViewAuth:
    """FastAPI dependency: the session cookie or the bearer header on every non-public route."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        self._header = TokenCheck(self.token)
        key = secrets.token_bytes(32)
        self._session = (
            hmac.new(key, self.token.encode(), hashlib.sha256).hexdigest() if self.token else None
        )

    def __call__(self, request: Request) -> None:
        if self.token is None or request.url.path in PUBLIC_PATHS:
            return
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if self._session and secrets.compare_digest(cookie.encode(), self._session.encode()):
            return
        self._header(request)  # 401 unless the bearer header holds the token

    def open_session(self, request: Request) -> Response:
        """``POST /session``: the bearer header checked, the session cookie set."""
        if self.token is None:
            return Response(status_code=204)
        self._header(request)
        response = Response(status_code=204)
        response.set_cookie(
            SESSION_COOKIE, self._session or "", httponly=True, samesite="strict", path="/"
        )
        return response
