"""Which ``RunConfig`` fields are secret, and how each field enters the config fingerprint.

The fingerprint (``RunConfig.fingerprint_fields``) is what a resume must match. Each field says
in its own metadata (key :data:`FINGERPRINT`) whether it enters it:

- :data:`ALWAYS` (no metadata): the field changes what the run produces;
- :data:`NEVER` (:func:`outside_fingerprint`): paths, worker counts, servers, the storage cap,
  the executor — nothing any artifact depends on;
- :data:`WHEN_SET` (:func:`fingerprint_when_set`): fields added after runs were made without
  them enter only once set off their default, so those runs keep their fingerprint (and resume).

A new field that changes the artifacts needs no metadata unless runs exist without it: then it
is ``fingerprint_when_set``; one that changes none is ``outside_fingerprint``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = [
    "SECRET_FIELDS",
    "FINGERPRINT",
    "ALWAYS",
    "NEVER",
    "WHEN_SET",
    "outside_fingerprint",
    "fingerprint_when_set",
    "membership",
    "fingerprinted_values",
]

#: Fields never written anywhere (run_manifest.json, logs, the status snapshot).
SECRET_FIELDS = frozenset({"status_token"})

FINGERPRINT = "fingerprint"
"""The field metadata key of fingerprint membership."""
ALWAYS, NEVER, WHEN_SET = "always", "never", "when_set"


def outside_fingerprint(default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A field that changes no artifact: never in the fingerprint (``dataclasses.field``'s
    arguments besides: ``default_factory``, ``repr``)."""
    return dataclasses.field(default=default, metadata={FINGERPRINT: NEVER}, **kwargs)


def fingerprint_when_set(default: Any) -> Any:
    """A field added after runs were made without it: in the fingerprint only when it is not
    ``default``."""
    return dataclasses.field(default=default, metadata={FINGERPRINT: WHEN_SET})


def membership(cls_or_config: Any) -> dict[str, str]:
    """Each field's membership (:data:`ALWAYS`, :data:`NEVER` or :data:`WHEN_SET`), in field
    order."""
    return {f.name: f.metadata.get(FINGERPRINT, ALWAYS) for f in dataclasses.fields(cls_or_config)}


def fingerprinted_values(config: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` (``config.to_dict()``, in field order) that enter the
    fingerprint: ``ALWAYS`` fields, and ``WHEN_SET`` fields off their default."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    out = {}
    for name, value in values.items():
        kind = fields[name].metadata.get(FINGERPRINT, ALWAYS)
        if kind == NEVER or (kind == WHEN_SET and value == fields[name].default):
            continue
        out[name] = value
    return out
