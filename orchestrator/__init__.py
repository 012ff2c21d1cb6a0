"""The run: queue, worker pool, dispatch, checkpoint, supervision of servers and workers, and the
Ray executor (``hallulog.orchestrator.run``).

This folder is also the documented entry point, ``python -m orchestrator run`` (its
``__main__``): it imports nothing here, so the entry module installed under this name is these
two files alone.
"""
