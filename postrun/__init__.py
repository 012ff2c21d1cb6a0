"""After the queue drains: label (LLM judge) → consolidate → exports → validate, plus repair.

Each step reads the artifact root as streams and can run alone (``hallulog consolidate``,
``validate``, ``retry``); consolidate → exports → validate is one pipeline, ``finish.py``.
"""
