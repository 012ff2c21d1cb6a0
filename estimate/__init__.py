"""What a run will store and how long it will take, before it runs (``hallulog estimate``):
the projection of its bytes and the measurements it starts from."""
