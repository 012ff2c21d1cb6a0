"""``register()``: the ``vllm.general_plugins`` entry point.

vLLM calls it in every process, possibly several times. It

1. registers :class:`hallulog_vllm.connector.HallulogHiddenStatesConnector` as the KV connector
   :data:`CONNECTOR_NAME` (use it in ``--kv-transfer-config``); on CUDA it behaves exactly like
   upstream's ``ExampleHiddenStatesConnector``, elsewhere it writes synchronously;
2. on the CPU platform, when vLLM falls back to C++ replacements for Triton kernels and a probe
   shows the replacement of the rejection sampler's ``expand_kernel`` broken, installs
   :func:`hallulog_vllm.expand_fix.expand_kernel_impl` before the worker registers the overrides.

What was applied is logged and kept in :func:`applied_fixes`. For diagnosis (and the tests that
show each bug), ``HALLULOG_VLLM_SKIP_FIXES=expand_kernel`` leaves a fix out.
"""

from __future__ import annotations

import logging
import os

# A child of the "vllm" logger, so the lines land in the server log vLLM configures.
logger = logging.getLogger("vllm.plugins.hallulog")

__all__ = ["CONNECTOR_NAME", "applied_fixes", "register"]

CONNECTOR_NAME = "HallulogHiddenStatesConnector"
_EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
_applied: dict[str, str] = {}
_checked: set[str] = set()


def applied_fixes() -> dict[str, str]:
    """What :func:`register` did in this process: fix name → reason."""
    return dict(_applied)


def register() -> None:
    """Entry point; idempotent, never raises (a failing plugin must not take vLLM down)."""
    skipped = {s.strip() for s in os.environ.get("HALLULOG_VLLM_SKIP_FIXES", "").split(",")}
    for name, step in (("connector", _register_connector), ("expand_kernel", _fix_expand_kernel)):
        if name in _checked:
            continue
        if name in skipped:
            logger.warning("hallulog vLLM plugin: %s skipped (HALLULOG_VLLM_SKIP_FIXES)", name)
            continue
        try:
            applied, outcome = step()
        except Exception:
            logger.exception("hallulog vLLM plugin: %s step failed", name)
            continue
        _checked.add(name)
        if applied:
            _applied[name] = outcome
            logger.info("hallulog vLLM plugin: %s: %s", name, outcome)
        else:
            logger.info("hallulog vLLM plugin: %s: not needed (%s)", name, outcome)


def _register_connector() -> tuple[bool, str]:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector

    upstream = example_hidden_states_connector.ExampleHiddenStatesConnector
    if not hasattr(upstream, "_submit_async_write"):
        logger.warning(
            "hallulog vLLM plugin: upstream %s has no _submit_async_write; the CPU write path "
            "will not be used (this vLLM version needs a plugin update)",
            upstream.__name__,
        )
    if CONNECTOR_NAME not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(
            CONNECTOR_NAME, "hallulog_vllm.connector", "HallulogHiddenStatesConnector"
        )
    return (
        True,
        f"registered kv_connector {CONNECTOR_NAME!r} (sync writes when the cache is not on CUDA)",
    )


def _fix_expand_kernel() -> tuple[bool, str]:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False, "not the CPU platform"
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:  # Triton-CPU present: vLLM runs the real kernel, no override involved
        return False, "Triton usable: no C++ kernel override"
    from vllm.utils import cpu_triton_utils

    original = getattr(cpu_triton_utils, "_expand_kernel_impl", None)
    if original is None:
        return False, "this vLLM has no cpu_triton_utils._expand_kernel_impl"
    from hallulog_vllm.expand_fix import expand_is_broken, expand_kernel_impl

    if original is expand_kernel_impl:
        return False, "already replaced"
    try:
        current_platform.import_kernels()  # the probe needs torch.ops._C loaded
    except Exception:
        logger.debug("import_kernels failed before the expand probe", exc_info=True)
    broken, reason = expand_is_broken(original)
    if not broken:
        return False, f"upstream implementation passes the probe: {reason}"
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    # If the worker registered its overrides already (not the case in vLLM's own start-up order,
    # where plugins load first), replace the registered one too.
    from vllm.triton_utils import dispatcher

    if _EXPAND_KERNEL in dispatcher._registry:
        dispatcher.register_kernels({_EXPAND_KERNEL: expand_kernel_impl})
    return True, f"replaced cpu_triton_utils._expand_kernel_impl ({reason})"
