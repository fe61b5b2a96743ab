"""What a run measured, read from the files a user already has: a PyTorch profiler trace (Kineto's Chrome trace
JSON), a CUDA memory snapshot (``torch.cuda.memory._snapshot()`` as ``_dump_snapshot`` pickles it) and plain logged
numbers (step time, ``max_memory_allocated``, ``max_memory_reserved``).

``kineto.py`` reads a trace's spans in bounded memory, ``timeline.py`` turns them into a step's named terms by
interval arithmetic, ``snapshot.py`` reads a snapshot with an unpickler that admits no class at all, and
``logged.py`` reads logged numbers. Every file is read through ``meshplan.files``; every refusal is one
``ValueError`` line. Standard library only: nothing here imports torch.
"""
