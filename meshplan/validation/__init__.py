"""Predictions held against published measured runs, and the fit of a cluster profile.

- training.py: every training run of catalog/runs against its prediction, leave-one-source-out, the bands;
- memory.py: the published peak-memory readings against the bill;
- serving.py: the published serving measurements against ``serve``;
- fit.py: the shared scales fitted over measured runs (the machinery both the catalog's and a user's fit use);
- calibrate.py: ``meshplan calibrate``, a profile fitted from a user's own runs.

May import the core, the reports and the spec; never the CLI or the server.
"""
