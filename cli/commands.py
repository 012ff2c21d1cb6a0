"""The CLI's post-run commands (``consolidate``, ``validate``, ``retry``) and the closing summary
of a run."""

from __future__ import annotations

from hallulog.config.plan import plan_task
from hallulog.config.run_config import RunConfig
from hallulog.contracts.root_lock import holds_root
from hallulog.orchestrator.run import RunResult
from hallulog.orchestrator.run.progress import describe_capture_failures

__all__ = [
    "format_result",
    "print_validation",
    "print_finished",
    "print_merge",
    "consolidate_command",
    "validate_command",
    "retry_command",
]


def format_result(result: RunResult) -> str:
    """A few lines a person reads at the end of a run."""
    done = result.done_before + result.done
    labels = result.labels
    graded = labels.get("correct", 0) + labels.get("hallucinated", 0)
    balance = (
        f"{labels.get('correct', 0)} correct / {labels.get('hallucinated', 0)} "
        f"hallucinated / {labels.get('unlabeled', 0)} unlabeled"
    )
    if graded:
        balance += f" ({100 * labels.get('hallucinated', 0) / graded:.0f}% hallucinated)"
    if labels.get("unparsed"):  # choice/numeric answers with nothing to compare (hallucinated)
        balance += f"; {labels['unparsed']} unparsed"
    if labels.get("no_answer"):  # reasoning never closed: not graded, among the unlabeled
        balance += f"; {labels['no_answer']} no_answer"
    return "\n".join(
        [
            f"run finished in {result.wall_seconds:.1f} s: {done}/{result.total} prompts done "
            f"({result.done} this session, {result.done_before} before), {len(result.failed)} failed, "
            f"{describe_capture_failures(result.capture_errors, result.capture_reasons)} "
            "capture(s) failed",
            f"labels: {balance}",
            f"artifacts: {result.artifact_root}",
        ]
        + _positions_line(result)
        + (
            [
                f"consolidated: {result.consolidation['prompts']} prompts, "
                f"{result.consolidation['activations']} activations in "
                f"{result.consolidation['seconds']:.2f} s; validation "
                f"{'OK' if result.validation and result.validation['ok'] else 'FAILED'}"
            ]
            if result.consolidation
            else []
        )
        + _evaluation_line(result.artifact_root)
    )


def _positions_line(result: RunResult) -> list[str]:
    """With --positions: the names that did not exist for some stored generations."""
    missing = {k: v for k, v in result.positions_missing.items() if v}
    if not missing:
        return []
    return [
        "positions absent (stored without them, docs/alignment.md): "
        + ", ".join(f"{name} in {n} generation(s)" for name, n in sorted(missing.items()))
    ]


def _evaluation_line(root) -> list[str]:
    from hallulog.evaluation import report_path

    path = report_path(root)
    return [f"evaluation report: {path}"] if path else []


def print_validation(report: dict) -> None:
    """The validation report's terminal summary (counts, examples, repair commands)."""
    from hallulog.postrun.validate import format_report

    print(format_report(report))


@holds_root("consolidate")  # one writer per root (contracts/root_lock.py)
def consolidate_command(config: RunConfig, *, merge: bool = False) -> int:
    """``hallulog consolidate``: consolidate, export and validate existing worker outputs."""
    from hallulog.postrun.finish import finish

    done = finish(
        config.artifact_root, expected_prompt_ids=plan_task(config).prompt_ids, merge=merge
    )
    print_finished(done)
    if (
        config.profile.attention_features and done.ok
    ):  # any run, any backend: docs/formats/attention.md
        from hallulog.contracts.run_manifest import RunManifest
        from hallulog.postrun.attention_gather import store_attention

        model = RunManifest.require(config.artifact_root).model_path
        # summaries its workers kept from generation first (none on a vLLM run), then the pass
        passed = store_attention(config.artifact_root, model, in_pass=True)
        print(
            f"attention features: {passed.generations} generations ({passed.tokens} tokens) in "
            f"{passed.seconds:.1f} s, {passed.already} already stored"
        )
    return 0 if done.ok else 1


def _print(text: str, local: tuple | None) -> None:
    """``text``, with ``local = (staging root, URL)``: the staging root named as the URL."""
    print(text.replace(str(local[0]), local[1]) if local else text)


def print_finished(done, local: tuple | None = None) -> None:
    """What the post-run pipeline did (``postrun.finish``'s result); ``local``: see _print."""
    from hallulog.postrun.validate import format_report

    result = done.consolidation
    print(
        f"consolidated {result['prompts']} prompts, {result['generations']} generations, "
        f"{result['activations']} activations ({result['total_bytes']} bytes) in "
        f"{result['seconds']:.2f} s: {result['activation_modes']}"
    )
    print("exports: " + ", ".join(f"{k} ({v})" for k, v in done.exports.items()))
    _print(format_report(done.validation), local)


def print_merge(summary: dict, local: tuple | None = None) -> None:
    """What ``merge`` did; ``local``: see _print."""
    from hallulog.postrun.validate import format_report

    c = summary["consolidation"]
    out = local[1] if local else summary["out"]
    print(
        f"merged {summary['shards']} shards ({summary['worker_dirs']} worker dirs, "
        f"{summary['prompts']} prompts) into {out}: {c['generations']} "
        f"generations, {c['activations']} activations"
    )
    _print(format_report(summary["validation"]), local)


def validate_command(config: RunConfig, *, deep: bool = False) -> int:
    """``hallulog validate``: check the artifacts; non-zero exit when they are incomplete.
    ``deep``: also audit every stored activation against its token ids (docs/alignment.md)."""
    from hallulog.postrun.validate import validate

    report = validate(config.artifact_root, expected_prompt_ids=plan_task(config).prompt_ids)
    print_validation(report)
    rc = 0 if report["ok"] else 1
    if deep:
        from hallulog.evaluation import run_deep_audit

        rc = max(rc, 0 if run_deep_audit(config.artifact_root)["ok"] else 1)
    return rc


def retry_command(config: RunConfig) -> int:
    """``hallulog retry``: reprocess exactly the failed or incomplete prompts, re-consolidate."""
    from hallulog.orchestrator.run import run
    from hallulog.postrun.repair import prompts_to_retry

    expected = plan_task(config).prompt_ids
    retry = prompts_to_retry(config.artifact_root, expected)
    print(
        f"retrying {len(retry)} prompt(s): "
        + ", ".join(sorted(retry)[:10])
        + (" ..." if len(retry) > 10 else "")
    )
    result = run(config, only=retry, redo=retry)
    print(format_result(result))
    if result.validation is not None:
        print_validation(result.validation)
        return 0 if result.validation["ok"] and not result.failed else 1
    return 1 if result.failed else 0
