"""How long a training step takes: compute, kernels, the pipeline's bubble and the collectives left exposed.

- flops.py: the GEMMs and FLOPs of a layer, and the published FLOP conventions;
- compute.py, attention_kernels.py, te_ring.py: the time of a layer's kernels on a GPU kind;
- stage_time.py: one pipeline stage's forward and backward;
- step_time.py: the step, with its collectives overlapped as the stack allows, and MFU.
"""
