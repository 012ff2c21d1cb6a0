"""How a worker asks the embedded server for attention summaries captured during generation,
and where the server says they are (docs/formats/attention.md, "Captured during generation").

A request's ``kv_transfer_params`` holds ``hallulog_attention: true``; the reply's
``kv_transfer_params.attention_paths`` lists one file per choice (null for a choice without
one), each a safetensors file of ``features`` ``[tokens, layers, heads, 5]`` float32 and
``token_ids`` (the prompt's, then the answer's).
"""

from __future__ import annotations

__all__ = ["ATTENTION_FIELD", "ATTENTION_PATHS"]

ATTENTION_FIELD = "hallulog_attention"
"""The request's ``kv_transfer_params`` flag asking for the summaries."""
ATTENTION_PATHS = "attention_paths"
"""The reply's ``kv_transfer_params`` list of summary files, one per choice."""
