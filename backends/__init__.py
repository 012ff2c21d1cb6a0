"""The inference servers a run talks to: their processes (spawn, health, stop), ports, the
model they serve, and the vLLM command line."""
