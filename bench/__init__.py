"""The benches, importable from the tests as a package (``from bench.instant_run import
InstantFleet``); each script still runs as ``python bench/NAME.py``. A module that both imports a
sibling and is imported by a test picks the sibling's name by how it was loaded (``__package__``)."""
