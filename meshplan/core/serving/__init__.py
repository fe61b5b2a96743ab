"""Serving: the memory of a replica, the time of a prefill and a decode step, load, caps and the serving search.

- bill.py: weights, KV cache per token and what fits (``meshplan serving``);
- shape.py and phases.py: a replica's shape and the time of its prefill and decode steps;
- caps.py: the engine's own caps on a batch;
- load.py and offline.py: the batch an engine holds under a rate or a concurrency, and whole offline runs;
- disagg.py: prefill and decode on separate pools;
- search.py: every serving layout ranked under latency targets (``meshplan serve-plan``); splits.py: the bounded
  search of prefill/decode splits it uses on large fleets.
"""
