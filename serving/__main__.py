"""``hallulog serve`` (``python -m hallulog.serving``): load the model, start the engine thread,
serve HTTP with uvicorn."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time

from hallulog.serving.config import ServerConfig, parse_args

logger = logging.getLogger("hallulog.serving")


def build_server(config: ServerConfig):
    """Load the model and return the FastAPI app with its engine started."""
    import torch
    from hallulog.serving.app import create_app
    from hallulog.serving.capture import SpoolWriter, num_layer_ids, parse_layer_ids
    from hallulog.serving.engine_pool import EnginePool, plan_threads
    from hallulog.serving.memory import GB, plan_budget, resident_bytes
    from hallulog.serving.metrics import ServingMetrics
    from hallulog.serving.model_loader import load_model

    engines, threads = plan_threads(config.engines, config.num_threads)
    torch.set_num_threads(threads)
    loaded = load_model(config.model, config.dtype, config.max_model_len)
    spool = layers = None
    if config.spool_dir:
        spool = SpoolWriter(config.spool_dir)
        if os.environ.get("HALLULOG_CAPTURE_FAULTS"):  # fault tests only
            from hallulog.serving.capture_faults import install_from_env

            install_from_env(spool)
        layers = parse_layer_ids(config.capture_layers, num_layer_ids(loaded.model))
    metrics = ServingMetrics(config.model_name)
    engine = EnginePool(
        loaded,
        engines,
        threads=threads,
        max_batch_size=config.max_batch_size,
        batch_wait_ms=config.batch_wait_ms,
        spool=spool,
        capture_layers=layers,
        metrics=metrics,
        fused_decode=config.fused_decode,
        kv_budget=0,  # set below, once the weights are in place
    )
    dropped = engine.release_model_weights()  # the engines never run the model's own forward
    static = resident_bytes()
    budget = plan_budget(config.max_memory_gb, static)
    engine.kv_budget.limit = budget
    engine.start()
    logger.info(
        "%d engine(s), %d intra-op thread(s) each; %.2f GB resident with the weights (%.2f GB of "
        "plain copies dropped), key/value cache budget %.2f GB",
        len(engine.engines),
        threads,
        static / GB,
        dropped / GB,
        budget / GB,
    )
    return create_app(engine, config.model_name, metrics)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from hallulog.serving.unused_packages import keep_out_unused_packages

    keep_out_unused_packages()  # before the model's modules import transformers
    import uvicorn

    t0 = time.monotonic()
    try:
        app = build_server(config)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logger.info(
        "model %s ready in %.1f s; listening on http://%s:%d",
        config.model_name,
        time.monotonic() - t0,
        config.host,
        config.port,
    )
    options = dict(log_level=config.log_level, access_log=config.log_level == "debug")
    if config.fd is None:
        uvicorn.run(app, host=config.host, port=config.port, **options)
        return 0
    # uvicorn's own --fd takes any descriptor for a Unix socket; this one is TCP: the socket's
    # family and type are read from the descriptor
    sock = socket.socket(fileno=config.fd)
    uvicorn.Server(uvicorn.Config(app, **options)).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
