"""In what dtype a capture file holds its rows: the request field (docs/contracts.md, "Capture
file").

A capture request may carry ``kv_transfer_params["hallulog_capture_dtype"]`` (the run's stored
dtype); a server that honours it casts the rows before it writes them (IEEE round to nearest
even: the bytes the worker would have made of a model-dtype file), so the file is half the size
of a float32 one and the worker copies it into the store without a cast. A server that ignores
the field (upstream vLLM, older hallulog) writes the model dtype; the worker reads every file by
its header's dtype, so either way the store holds the same bytes.

```python
from hallulog.contracts.capture_dtype import check_capture_dtype
check_capture_dtype("float16")   # "float16"
check_capture_dtype(None)        # None: the model dtype
```

Only :mod:`contracts` may be imported here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CAPTURE_DTYPE_FIELD", "CAPTURE_DTYPES", "check_capture_dtype"]

CAPTURE_DTYPE_FIELD = "hallulog_capture_dtype"
"""The key in a request's ``kv_transfer_params``."""
CAPTURE_DTYPES = ("float16", "bfloat16", "float32")
"""The dtypes a capture may be asked in (the stored dtypes)."""


def check_capture_dtype(value: Any) -> str | None:
    """``value`` as a capture dtype (None: the model's); ValueError if it is none."""
    if value is None or value in CAPTURE_DTYPES:
        return value
    raise ValueError(
        f"kv_transfer_params.{CAPTURE_DTYPE_FIELD}: expected one of "
        f"{', '.join(CAPTURE_DTYPES)}, got {value!r}"
    )
