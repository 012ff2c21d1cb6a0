"""What the orchestrator, the workers and the servers agree on, in one place all depend on.

- :mod:`contracts.ids`: prompt ids, activation keys, sample seeds, config fingerprints;
- :mod:`contracts.prompt_group`: :class:`PromptGroup`, the unit of work on the queue;
- :mod:`contracts.layout`: every path under an artifact root;
- :mod:`contracts.jsonl`: streaming JSONL (committed-tail rule, append, rollback);
- :mod:`contracts.run_manifest`: ``run_manifest.json`` as a frozen :class:`RunManifest`;
- :mod:`contracts.rows`: the JSONL row types;
- :mod:`contracts.answer_match`: the TriviaQA answer normalisation and alias match;
- :mod:`contracts.config_cli`: a frozen config dataclass → argparse flags;
- :mod:`contracts.errors`, :mod:`contracts.process`.

Nothing here imports from ``orchestrator``, ``workers``, ``serving`` or ``api``.
"""

from contracts.errors import ArtifactError, HallulogError, MalformedLineError
from contracts.ids import activation_key, fingerprint, prompt_id_for, sample_seed
from contracts.prompt_group import PromptGroup

__all__ = [
    "PromptGroup",
    "prompt_id_for",
    "activation_key",
    "sample_seed",
    "fingerprint",
    "HallulogError",
    "ArtifactError",
    "MalformedLineError",
]
