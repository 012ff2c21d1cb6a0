"""The status token: header only, never on disk or in logs; off loopback; path traversal.

Requests for traversal paths go over a raw socket so that no client normalises the path first.
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import httpx
import pytest
from hallulog.api import StatusServer
from hallulog.config.manifest import build_manifest
from hallulog.config.run_config import RunConfig

from tests.api.status_fixtures import make_board

TOKEN = "s3cret-status-token"
ROUTES = ("/status", "/metrics", "/events?max=1", "/")
TRAVERSALS = (
    "/../../../../etc/passwd",
    "/status/../../../etc/passwd",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/metrics/..%2f..%2f..%2fetc%2fpasswd",
    "/events/../../etc/passwd",
    "/..%5c..%5c..%5cetc%5cpasswd",
    "//etc/passwd",
    "/static/../../etc/passwd",
    "/dashboard.html/../../../etc/passwd",
    "/?file=../../../../etc/passwd",
    "/status?path=/etc/passwd",
    "/%00/etc/passwd",
    "/api/../../proc/self/environ",
)


@pytest.fixture
def board(clock):
    b = make_board(clock, window_s=60.0, history_bucket_s=10.0)
    b.group_done(0, "p1", generations=3, tokens=12)
    return b


def _raw_get(port: int, target: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    lines = [f"GET {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while len(data) < 200_000:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data


def _non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: it picks the route's source
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def test_token_off_loopback_is_required_and_header_only(board, caplog):
    caplog.set_level(logging.DEBUG)
    with StatusServer(board.snapshot, host="0.0.0.0", port=0, token=TOKEN) as srv:
        port = srv.port
        hosts = ["127.0.0.1"] + [a for a in [_non_loopback_address()] if a]
        for host in hosts:
            base = f"http://{host}:{port}"
            for route in ROUTES[:3]:
                assert httpx.get(base + route, timeout=5).status_code == 401, (host, route)
                sep = "&" if "?" in route else "?"
                assert (
                    httpx.get(f"{base}{route}{sep}token={TOKEN}", timeout=5).status_code == 401
                ), (host, route)
                ok = httpx.get(
                    base + route, timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}
                )
                assert ok.status_code == 200, (host, route)
                assert TOKEN not in ok.text
            page = httpx.get(base + "/", timeout=5)
            assert page.status_code == 200 and TOKEN not in page.text
    server_side = [
        r.getMessage() for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))
    ]  # the test's own client
    assert server_side is not None and not any(TOKEN in m for m in server_side)


@pytest.mark.parametrize("token", [None, TOKEN])
def test_no_route_reads_a_path(board, token):
    auth = {"Authorization": f"Bearer {TOKEN}"} if token else {}
    with StatusServer(board.snapshot, port=0, token=token) as srv:
        for target in TRAVERSALS:
            for headers in ({}, auth):
                status, body = _raw_get(srv.port, target, headers)
                assert b"root:x:0:0" not in body and b"PATH=" not in body, target
                if target.startswith(("/?", "/status?")):
                    assert status in (200, 401), (target, status)
                else:
                    assert status in (400, 401, 404), (target, status)


def test_token_is_never_written_to_the_manifest_or_repr(tmp_path):
    config = RunConfig(
        artifact_root=tmp_path, status_port=0, status_host="0.0.0.0", status_token=TOKEN
    )
    manifest = build_manifest(
        config,
        run_id=None,
        model_name="m",
        model_path="/m",
        layer_ids=[0],
        hidden_size=4,
        num_hidden_layers=1,
        dataset="triviaqa",
        split="validation",
        prompt_template="{q}",
        worker_count=1,
        total_prompts=1,
    )
    assert TOKEN not in json.dumps(manifest)
    assert manifest["config"]["status_token"] is None
    assert TOKEN not in repr(config)


def test_cli_reads_the_token_from_the_environment(monkeypatch, tmp_path):
    from hallulog.cli.app import build_parser, config_from_args

    monkeypatch.setenv("HALLULOG_STATUS_TOKEN", TOKEN)
    args = build_parser().parse_args(
        ["run", "--artifact-root", str(tmp_path), "--status-host", "0.0.0.0", "--status-port", "0"]
    )
    assert config_from_args(args).status_token == TOKEN


def test_docs_say_header_only():
    text = (Path(__file__).resolve().parents[2] / "docs" / "status.md").read_text().lower()
    assert "header only" in text and "?token=" not in text.replace("no `?token=`", "")
