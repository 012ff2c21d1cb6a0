"""The explorer's routes: HTML pages and the same models as JSON under ``/api/``.

A run root serves ``/`` (the run), ``/questions``, ``/q/{prompt_id}``, ``/plots/{name}``; a
study root serves ``/`` (the study), ``/compare/{name}`` and each cell's run pages under
``/cells/{cell}/``, its index built on the first visit. Handlers are plain functions, run in
the thread pool (DuckDB and Parquet reads block). No route reads a file named by the request:
plots are served from the names ``report.json`` lists (and a study's ``compare/*.png`` found
at start-up).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from hallulog.api.errors import error_response
from hallulog.view.auth import ViewAuth
from hallulog.view.defaults import DEFAULT_MEMORY_LIMIT
from hallulog.view.index import QuestionIndex
from hallulog.view.models import QuestionQuery
from hallulog.view.question import load_question
from hallulog.view.render import Links, render
from hallulog.view.run_files import ViewInputError, open_run_files
from hallulog.view.study import StudyFiles, is_study, open_study, study_page
from hallulog.view.summary import run_summary
from pydantic import ValidationError
from starlette.exceptions import HTTPException

__all__ = ["create_app", "RunSite"]

_NO_STORE = {"Cache-Control": "no-store"}


class RunSite:
    """One run's pages: its files and question index, opened on first use."""

    def __init__(self, root: Path, *, memory_limit: str = DEFAULT_MEMORY_LIMIT, threads: int = 2):
        self.root = Path(root)
        self._options = {"memory_limit": memory_limit, "threads": threads}
        self._index: QuestionIndex | None = None
        self._lock = threading.Lock()

    def index(self) -> QuestionIndex:
        with self._lock:
            if self._index is None:
                self._index = QuestionIndex(open_run_files(self.root), **self._options)
            return self._index

    def close(self) -> None:
        with self._lock:
            if self._index is not None:
                self._index.close()
                self._index = None


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=_NO_STORE)


def _title(site: RunSite) -> str:
    m = site.index().files.manifest
    return f"{m.get('model') or 'run'} · {m.get('dataset') or ''}" if m else str(site.root)


def _query(**fields) -> QuestionQuery:
    try:
        return QuestionQuery(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise HTTPException(400, f"{where}: {first.get('msg')}") from None


def _run_routes(
    app: FastAPI, prefix: str, site_of: Callable[[Request], RunSite], study_depth: int | None
) -> None:
    def links(depth: int = 0) -> Links:
        return Links(static=False, depth=depth, study_depth=study_depth)

    @app.get(prefix + "/", response_class=HTMLResponse)
    def run_page(request: Request) -> HTMLResponse:
        site = site_of(request)
        summary = run_summary(site.index())
        return _html(render("run.html", links=links(), title=_title(site), run=summary))

    def page_of(request, filter, q, sort, desc, page, per_page, methods):
        site = site_of(request)
        query = _query(
            filter=filter,
            q=q,
            sort=sort,
            desc=desc,
            page=page,
            per_page=per_page,
            methods=tuple(m for part in methods for m in part.split(",") if m),
        )
        try:
            return site, site.index().page(query)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None

    @app.get(prefix + "/questions", response_class=HTMLResponse)
    def questions_page(
        request: Request,
        filter: str = "all",
        q: str = "",
        sort: str = "n",
        desc: bool = False,
        page: int = 1,
        per_page: int = 50,
        methods: list[str] = Query(default=[]),  # noqa: B008
    ) -> HTMLResponse:
        site, result = page_of(request, filter, q, sort, desc, page, per_page, methods)
        body = render(
            "questions.html",
            links=links(),
            title=f"questions · {_title(site)}",
            page=result,
            static=False,
            exported=(),
            limit=None,
        )
        return _html(body)

    @app.get(prefix + "/api/questions")
    def questions_json(
        request: Request,
        filter: str = "all",
        q: str = "",
        sort: str = "n",
        desc: bool = False,
        page: int = 1,
        per_page: int = 50,
        methods: list[str] = Query(default=[]),  # noqa: B008
    ) -> JSONResponse:
        _, result = page_of(request, filter, q, sort, desc, page, per_page, methods)
        return JSONResponse(result.model_dump(mode="json"), headers=_NO_STORE)

    def detail(request: Request, prompt_id: str):
        site = site_of(request)
        found = load_question(site.index(), prompt_id)
        if found is None:
            raise HTTPException(404, f"no question {prompt_id!r} in {site.root}")
        return site, found

    @app.get(prefix + "/q/{prompt_id}", response_class=HTMLResponse)
    def question_page(request: Request, prompt_id: str) -> HTMLResponse:
        site, found = detail(request, prompt_id)
        title = f"{found.question or prompt_id} · {_title(site)}"
        return _html(render("question.html", links=links(1), title=title, question=found))

    @app.get(prefix + "/api/q/{prompt_id}")
    def question_json(request: Request, prompt_id: str) -> JSONResponse:
        _, found = detail(request, prompt_id)
        return JSONResponse(found.model_dump(mode="json"), headers=_NO_STORE)

    @app.get(prefix + "/api/run")
    def run_json(request: Request) -> JSONResponse:
        summary = run_summary(site_of(request).index())
        return JSONResponse(summary.model_dump(mode="json"), headers=_NO_STORE)

    @app.get(prefix + "/plots/{name}")
    def plot(request: Request, name: str) -> FileResponse:
        path = site_of(request).index().files.plots.get(name)
        if path is None:
            raise HTTPException(404, f"no plot {name!r}")
        return FileResponse(path, media_type="image/png")


def _study_routes(app: FastAPI, study: StudyFiles, sites: dict[str, RunSite]) -> None:
    @app.get("/", response_class=HTMLResponse)
    def study_html() -> HTMLResponse:
        page = study_page(study)
        body = render("study.html", links=Links(static=False), title="study", study=page)
        return _html(body)

    @app.get("/api/study")
    def study_json() -> JSONResponse:
        return JSONResponse(study_page(study).model_dump(mode="json"), headers=_NO_STORE)

    @app.get("/compare/{name}")
    def study_plot(name: str) -> FileResponse:
        path = study.plots.get(name)
        if path is None:
            raise HTTPException(404, f"no plot {name!r}")
        return FileResponse(path, media_type="image/png")

    def site_of(request: Request) -> RunSite:
        slug = request.path_params.get("cell")
        if slug not in sites:
            raise HTTPException(404, f"no cell {slug!r} in {study.root}")
        return sites[slug]

    _run_routes(app, "/cells/{cell}", site_of, study_depth=2)


def _errors(app: FastAPI) -> None:
    def respond(request: Request, status: int, message: str, headers=None) -> Response:
        if "/api/" in request.url.path or "text/html" not in request.headers.get("accept", ""):
            return error_response(status, message, headers)
        if status == 401:
            message += " · open /login#token=TOKEN to sign in"
        body = render(
            "message.html",
            links=Links(static=False),
            title=f"{status}",
            message=message,
            home=None,
        )
        return HTMLResponse(body, status_code=status, headers=headers)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        return respond(request, exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return respond(request, 400, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(ViewInputError)
    async def _input(request: Request, exc: ViewInputError) -> Response:
        return respond(request, 404, str(exc))


def create_app(
    root: Path | str,
    *,
    token: str | None = None,
    memory_limit: str = DEFAULT_MEMORY_LIMIT,
    threads: int = 2,
) -> FastAPI:
    """The explorer of a run root or a study root. A run root is opened (and its index built)
    here, so a root the explorer cannot show raises :class:`ViewInputError` at once."""
    root = Path(root)
    auth = ViewAuth(token)
    app = FastAPI(
        title="hallulog view",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(auth)],
    )
    _errors(app)
    options = {"memory_limit": memory_limit, "threads": threads}
    if is_study(root):
        study = open_study(root)
        sites = {slug: RunSite(r, **options) for slug, r in study.roots.items()}
        _study_routes(app, study, sites)
    else:
        site = RunSite(root, **options)
        site.index()
        sites = {"": site}
        _run_routes(app, "", lambda request: site, study_depth=None)
    app.state.sites = sites

    @app.get("/login", response_class=HTMLResponse)
    def login() -> HTMLResponse:
        return _html(render("login.html", links=Links(static=False), title="sign in"))

    @app.post("/session")
    def session(request: Request) -> Response:
        return auth.open_session(request)

    return app
