"""The checks of a ``RunConfig``'s checkpoint, server, executor and status-API fields: each
wrong value is one :class:`~hallulog.contracts.errors.ConfigError` naming its flag."""

from __future__ import annotations

import ipaddress
from typing import Any

from hallulog.contracts.errors import ConfigError

__all__ = ["check_server_fields"]


def check_server_fields(config: Any) -> None:
    """Check ``config``'s (a ``RunConfig``) checkpoint, server, Ray and status fields."""
    c = config
    _check(c.checkpoint_every is None or c.checkpoint_every >= 1, "--checkpoint-every must be >= 1")
    _check(c.checkpoint_interval > 0, "--checkpoint-interval must be > 0")
    _check(c.server_max_restarts >= 0, "--server-max-restarts must be >= 0")
    _check(c.server_restart_backoff >= 0, "--server-restart-backoff must be >= 0")
    _check(c.server_startup_timeout > 0, "--server-startup-timeout must be > 0")
    _check(
        c.server_base_port is None or 1 <= c.server_base_port <= 65535,
        "--server-base-port must be a TCP port",
    )
    _check(c.status_port is None or 0 <= c.status_port <= 65535, "--status-port must be a TCP port")
    _check(
        c.executor != "ray" or c.manage_servers,
        "--executor ray starts a server in every actor: drop --manage-servers false / "
        "--server-urls",
    )
    from hallulog.tasks.study import default_answer_kind

    if (
        c.executor == "ray"
        and not c.judge_url
        and (c.answer_kind or default_answer_kind(c.task)) == "judge"
    ):
        raise ConfigError(
            f"--executor ray with --task {c.task} needs --judge-url (the actors' servers are "
            "not reachable from the driver)"
        )
    _check(c.manage_servers or bool(c.server_urls), "--manage-servers false needs --server-urls")
    _check(
        c.status_port is None or _is_loopback(c.status_host) or bool(c.status_token),
        f"--status-host {c.status_host} is not loopback: set --status-token to expose the "
        "status API",
    )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
