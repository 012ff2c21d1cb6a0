"""The explorer's routes in process (Starlette's test client): every page, the JSON models,
errors, plots served only by the names report.json lists, and the status API's token rules."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hallulog.contracts import layout
from hallulog.view.app import create_app
from hallulog.view.auth import SESSION_COOKIE
from hallulog.view.server import ViewServer

HTML = {"Accept": "text/html"}


@pytest.fixture(scope="module")
def client(synthetic_run):
    app = create_app(synthetic_run)
    with TestClient(app) as c:
        yield c
    for site in app.state.sites.values():
        site.close()


def test_every_page_renders(client):
    run = client.get("/", headers=HTML)
    assert run.status_code == 200 and 'id="ranking"' in run.text
    page = client.get("/api/questions", params={"filter": "hallucinated", "per_page": 5}).json()
    assert page["total"] == page["counts"]["hallucinated"] and len(page["rows"]) == 5
    pid = page["rows"][0]["prompt_id"]
    listing = client.get("/questions?filter=hallucinated&per_page=5", headers=HTML)
    assert listing.status_code == 200 and f'href="q/{pid}"' in listing.text
    q = client.get(f"/q/{pid}", headers=HTML)
    assert q.status_code == 200 and pid in q.text and 'href="../questions"' in q.text
    assert client.get(f"/api/q/{pid}").json()["prompt_id"] == pid
    assert client.get("/api/run").json()["counts"]["prompts"] == 300


def test_methods_as_repeated_or_comma_separated_parameters(client):
    a = client.get("/api/questions?methods=sep_tbg&methods=logprob_min").json()
    b = client.get("/api/questions?methods=sep_tbg,logprob_min").json()
    assert a["methods"] == b["methods"] == ["sep_tbg", "logprob_min"]


@pytest.mark.parametrize(
    "url, status, words",
    [
        ("/api/questions?sort=nope", 400, "sort 'nope'"),
        ("/api/questions?page=0", 400, "page"),
        ("/api/questions?filter=maybe", 400, "filter"),
        ("/api/questions?methods=nope", 400, "have no scores"),
        ("/api/q/0000000000000000", 404, "no question"),
        ("/plots/..%2F..%2Frun_manifest.json", 404, "Not Found"),
        ("/plots/report.json", 404, "no plot"),
    ],
)
def test_bad_requests_are_one_line(client, url, status, words):
    r = client.get(url)
    assert r.status_code == status
    assert words in r.json()["error"]["message"]


def test_plots_are_the_ones_report_json_lists(synthetic_run, tmp_path):
    import shutil

    root = tmp_path / "run"
    shutil.copytree(synthetic_run, root)
    report_path = layout.evaluation_dir(root) / layout.REPORT_JSON
    report = json.loads(report_path.read_text())
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 32
    (layout.evaluation_dir(root) / "roc.png").write_bytes(png)
    (layout.evaluation_dir(root) / "other.png").write_bytes(png)
    report["plots"] = ["roc.png", "../run_manifest.json"]
    report_path.write_text(json.dumps(report))
    app = create_app(root)
    with TestClient(app) as c:
        assert c.get("/plots/roc.png").content == png
        assert c.get("/plots/other.png").status_code == 404
        assert 'src="plots/roc.png"' in c.get("/", headers=HTML).text
    app.state.sites[""].close()


def test_html_error_page_for_a_browser(client):
    r = client.get("/q/0000000000000000", headers=HTML)
    assert r.status_code == 404 and 'id="message"' in r.text


def test_token_header_or_session_cookie(synthetic_run):
    app = create_app(synthetic_run, token="s3cret")
    with TestClient(app) as c:
        assert c.get("/api/run").status_code == 401
        assert c.get("/", headers=HTML).status_code == 401
        assert c.get("/api/run?token=s3cret").status_code == 401  # never in the URL
        assert c.get("/api/run", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/run", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        login = c.get("/login")
        assert login.status_code == 200 and "ranking" not in login.text
        assert c.post("/session", headers={"Authorization": "Bearer no"}).status_code == 401
        assert SESSION_COOKIE not in c.cookies
        r = c.post("/session", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 204
        cookie = c.cookies[SESSION_COOKIE]
        assert "s3cret" not in cookie and "httponly" in r.headers["set-cookie"].lower()
        assert "samesite=strict" in r.headers["set-cookie"].lower()
        assert c.get("/", headers=HTML).status_code == 200  # the cookie now
        c.cookies.clear()
        c.cookies.set(SESSION_COOKIE, "forged")
        assert c.get("/", headers=HTML).status_code == 401
    app.state.sites[""].close()


def test_off_loopback_needs_a_token(synthetic_run):
    with pytest.raises(ValueError, match="pass --token TOKEN"):
        ViewServer(object(), host="0.0.0.0", port=0, token=None)  # type: ignore[arg-type]
    ViewServer(object(), host="0.0.0.0", port=0, token="t")  # type: ignore[arg-type]
