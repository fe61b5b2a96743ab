"""PyTorch-native accounting: what FSDP2, DTensor TP/SP and DDP hold tensor by tensor (shards.py) and the
collectives only they issue (collectives.py), as measured by ``meshplan check``; the work PyTorch-native stacks
run beyond the layer's kernels (overheads.py) and ring attention's fp32 merging (ring_merge.py)."""
