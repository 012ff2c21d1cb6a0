"""Presets: QA datasets read in the layouts they are released in, as QA records.

```python
from hallulog.tasks.presets import PRESETS, iter_preset_records
preset = PRESETS["squad"]
preset.default_template, preset.context_template, preset.answer_kind, preset.default_split
for rec in iter_preset_records("squad", "dev-v2.0.json", split=None, limit=100,
                               collector=collector, with_context=True, numeric_tolerance=1e-6):
    rec.dataset_id, rec.fields, rec.reference, rec.meta      # hallulog.tasks.qa.QARecord
```

| preset | released file | default kind | ids | context |
|---|---|---|---|---|
| ``nq_open`` | ``NQ-open.dev.jsonl`` | aliases | record index | — |
| ``squad`` | ``dev-v1.1.json``, ``dev-v2.0.json`` | aliases | ``id`` | paragraph |
| ``hotpotqa`` | ``hotpot_dev_distractor_v1.json`` | aliases | ``_id`` | the 10 paragraphs |
| ``popqa`` | ``popQA.tsv`` | aliases | ``id`` | — |
| ``truthfulqa`` | ``TruthfulQA.csv`` | judge | record index | — |
| ``sciq`` | ``test.json`` | choice (shuffled by hash) | record index | ``support`` |
| ``mmlu`` | ``data/test/<subject>_test.csv`` (or the dir) | choice | ``<subject>/<row>`` | — |
| ``gsm8k`` | ``test.jsonl`` | numeric | record index | — |
| ``svamp`` | ``SVAMP.json`` | numeric | ``ID`` | — |
| ``bioasq`` | ``training*.json`` (factoid only) | aliases | ``id`` | snippets |

A SQuAD v2 ``is_impossible`` question (or, in the HF export, one without answer texts) gets
``{"kind": "aliases", "value": None, "aliases": [], "unanswerable": True}``: it counts as correct
only when the model abstains (the grader's rule). BioASQ questions other than ``factoid`` are
skipped without a warning (they are counted in the record index). Each set's Hugging Face layout
(Parquet, JSON Lines or a ``save_to_disk`` directory, the hub's column names and nesting:
docs/tasks.md) is read too, to the same groups as the released file.
``with_context`` says whether the prompt shows the context (it picks ``context_template``);
``fields["context"]`` holds the context either way, ``meta`` keeps it only with
``with_context``. The bundled samples (``tasks/data/``) were
written for hallulog in each released layout; none is dataset text.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hallulog.tasks.base import MalformedCollector
from hallulog.tasks.presets import closed_form, open_domain
from hallulog.tasks.presets._common import (
    Bad,
    ConvertContext,
    Converter,
    RecordSource,
    generic_records,
)
from hallulog.tasks.qa import ANSWER_KINDS, QAParts, QARecord, iter_built
from hallulog.tasks.records import FORMATS, RecordAt

__all__ = [
    "Preset",
    "PRESETS",
    "iter_preset_records",
    "SHORT_TEMPLATE",
    "SHORT_CONTEXT_TEMPLATE",
    "CHOICE_TEMPLATE",
    "CHOICE_CONTEXT_TEMPLATE",
    "NUMERIC_TEMPLATE",
    "OPEN_TEMPLATE",
    "DATA_DIR",
]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

SHORT_TEMPLATE = "Answer the question with a short answer.\nQuestion: {{ question }}\nAnswer:"
SHORT_CONTEXT_TEMPLATE = (
    "Answer the question with a short answer, using the passage.\n"
    "Passage: {{ context }}\nQuestion: {{ question }}\nAnswer:"
)
CHOICE_TEMPLATE = (
    "{{ question }}\n{{ choices_text }}\nAnswer with the letter of the correct choice.\nAnswer:"
)
CHOICE_CONTEXT_TEMPLATE = (
    "Passage: {{ context }}\n{{ question }}\n{{ choices_text }}\n"
    "Answer with the letter of the correct choice.\nAnswer:"
)
NUMERIC_TEMPLATE = (
    "Solve the problem. Give the final answer as a number.\nProblem: {{ question }}\nAnswer:"
)
OPEN_TEMPLATE = "Answer the question in one or two sentences.\nQuestion: {{ question }}\nAnswer:"

_KIND_TEMPLATES: dict[str, tuple[str, str | None]] = {
    "aliases": (SHORT_TEMPLATE, SHORT_CONTEXT_TEMPLATE),
    "judge": (SHORT_TEMPLATE, SHORT_CONTEXT_TEMPLATE),
    "choice": (CHOICE_TEMPLATE, CHOICE_CONTEXT_TEMPLATE),
    "numeric": (NUMERIC_TEMPLATE, None),
}


@dataclass(frozen=True)
class Preset:
    """One released dataset layout."""

    name: str
    default_split: str
    """The split named in the prompt ids when none is given."""
    answer_kind: str
    """The default answer kind; ``answer_kinds`` lists every kind the records support."""
    answer_kinds: tuple[str, ...]
    default_template: str
    """Jinja2 prompt for ``answer_kind`` without context."""
    context_template: str | None
    """Jinja2 prompt showing ``{{ context }}`` (None: the set has no context)."""
    bundled_sample: str
    """File (or directory) name of the sample in ``tasks/data/``."""
    records: RecordSource
    to_qa: Converter
    doc: str
    what: str = "question"

    @property
    def bundled_path(self) -> Path:
        return DATA_DIR / self.bundled_sample

    def template_for(self, answer_kind: str | None = None, with_context: bool = False) -> str:
        """The preset's prompt for ``answer_kind`` (default: its own), with or without context."""
        kind = answer_kind or self.answer_kind
        self.check_kind(kind)
        if kind == self.answer_kind:
            plain, ctx = self.default_template, self.context_template
        else:
            plain, ctx = _KIND_TEMPLATES[kind]
            ctx = ctx if self.context_template is not None else None
        if with_context:
            if ctx is None:
                raise ValueError(
                    f"preset {self.name!r} has no context template for answer kind {kind!r}"
                )
            return ctx
        return plain

    def check_kind(self, kind: str) -> None:
        if kind not in self.answer_kinds:
            raise ValueError(
                f"preset {self.name!r} supports answer kinds "
                f"{', '.join(self.answer_kinds)}, not {kind!r}"
            )


def _preset(
    name: str,
    split: str,
    kinds: tuple[str, ...],
    sample: str,
    to_qa: Converter,
    *,
    context: bool = False,
    template: str | None = None,
    records: RecordSource = generic_records,
    what: str = "question",
) -> Preset:
    kind = kinds[0]
    plain, ctx = _KIND_TEMPLATES[kind]
    doc = (to_qa.__doc__ or "").strip()
    return Preset(
        name=name,
        default_split=split,
        answer_kind=kind,
        answer_kinds=kinds,
        default_template=template or plain,
        context_template=ctx if context else None,
        bundled_sample=sample,
        records=records,
        to_qa=to_qa,
        doc=doc,
        what=what,
    )


_OPEN = ("aliases", "judge")
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _preset("nq_open", "dev", _OPEN, "nq_open-sample-dev.jsonl", open_domain.nq_open),
        _preset(
            "squad",
            "dev",
            _OPEN,
            "squad-sample-dev-v2.0.json",
            open_domain.squad,
            context=True,
            records=open_domain.squad_records,
        ),
        _preset(
            "hotpotqa",
            "dev",
            _OPEN,
            "hotpotqa-sample-dev-distractor.json",
            open_domain.hotpotqa,
            context=True,
        ),
        _preset("popqa", "test", _OPEN, "popqa-sample.tsv", open_domain.popqa),
        _preset(
            "truthfulqa",
            "validation",
            ("judge", "aliases"),
            "truthfulqa-sample.csv",
            open_domain.truthfulqa,
            template=OPEN_TEMPLATE,
        ),
        _preset(
            "sciq",
            "test",
            ("choice", "aliases", "judge"),
            "sciq-sample-test.json",
            closed_form.sciq,
            context=True,
        ),
        _preset(
            "mmlu",
            "test",
            ("choice", "aliases", "judge"),
            "general_knowledge_test.csv",
            closed_form.mmlu,
            records=closed_form.mmlu_records,
        ),
        _preset(
            "gsm8k",
            "test",
            ("numeric", "aliases", "judge"),
            "gsm8k-sample-test.jsonl",
            closed_form.gsm8k,
        ),
        _preset(
            "svamp", "test", ("numeric", "aliases", "judge"), "svamp-sample.json", closed_form.svamp
        ),
        _preset(
            "bioasq",
            "train",
            _OPEN,
            "bioasq-sample-train.json",
            open_domain.bioasq,
            context=True,
            what="factoid question",
        ),
    )
}


def _converter(preset: Preset, ctx: ConvertContext):
    def convert(at: RecordAt) -> QAParts | str | None:
        try:
            return preset.to_qa(at, ctx)
        except Bad as exc:
            return str(exc)

    return convert


def iter_preset_records(
    name: str,
    path: str | Path | None = None,
    *,
    split: str | None = None,
    limit: int | None = None,
    collector: MalformedCollector,
    with_context: bool = False,
    numeric_tolerance: float = 1e-6,
    answer_kind: str | None = None,
    fmt: str = "auto",
    records_key: str | None = None,
) -> Iterator[QARecord]:
    """The valid records of preset ``name`` at ``path`` (None: its bundled sample), in file
    order, read lazily. The arguments are checked now, the file as it is read: malformed
    records go to ``collector``, a file without a valid one raises ``DatasetFormatError``.
    ``split`` picks a DatasetDict's split (and MMLU's ``data/<split>/`` directory); the split
    named in ids is the caller's (``split or preset.default_split``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[name]
    kind = answer_kind or preset.answer_kind
    if kind not in ANSWER_KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; choose one of {', '.join(ANSWER_KINDS)}")
    preset.check_kind(kind)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if (
        isinstance(numeric_tolerance, bool)
        or not isinstance(numeric_tolerance, (int, float))
        or not numeric_tolerance >= 0
    ):
        raise ValueError(f"numeric_tolerance must be a number >= 0, got {numeric_tolerance!r}")
    source = Path(path) if path is not None else preset.bundled_path
    if not source.exists():
        raise FileNotFoundError(f"{source}: no such dataset file for preset {name!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    ctx = ConvertContext(path=source, answer_kind=kind, with_context=with_context)
    records = preset.records(
        source, split=split, collector=collector, fmt=fmt, records_key=records_key
    )
    return iter_built(
        source,
        records,
        _converter(preset, ctx),
        kind=kind,
        tolerance=float(numeric_tolerance),
        limit=limit,
        collector=collector,
        what=preset.what,
    )
