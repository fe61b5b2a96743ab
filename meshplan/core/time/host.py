"""The host floor: a layer cannot run faster than the CPU issues its kernels.

The CPU queues kernels on the stream and runs ahead of the GPU while the GPU is the slower of the two; where
issuing a layer's kernels takes the host longer than running them takes the GPU, the GPU waits between kernels
and the layer takes the host's time. Per layer and pass:

    host_s = kernels issued x host seconds per kernel (by launch mode)
    layer_s = max(GPU seconds, host_s)

Kernels issued per layer forward are counted from the kernel inventory compute.py prices (``KERNELS_PER_LAYER``:
eager PyTorch 38, fused 20), plus the tensor-parallel collectives (2 all-reduces, or under sequence parallelism 2
all-gathers and 2 reduce-scatters, forward) and, in a MoE layer, the router and token permutation
(``MOE_ROUTING_KERNELS``). Backward issues twice the forward's kernels (an input and a weight gradient per
matmul, a gradient per elementwise op); full recompute issues the forward again.

Host seconds per kernel, by launch mode (``Launch``):

- eager: every op goes through Python, the autograd layer and the ATen dispatcher before cudaLaunchKernel
  (5-25 us per op). PyTorch's gpt-fast write-up ("Accelerating Generative AI with PyTorch II: GPT, Fast",
  PyTorch blog, Nov. 2023) measures Llama-2-7B in eager mode at 25.5 tokens/s on A100 and calls it CPU-overhead
  bound: 39 ms over 32 layers, 1.2 ms per layer for about 40 kernels (the 38 of the eager inventory and the KV
  cache's two writes): ``EAGER_HOST_S_PER_KERNEL`` 30 us. Megatron-LM and Transformer Engine launch fewer, fused
  kernels the same way, through Python modules, each with its own Python-side bookkeeping: the same host cost
  per kernel. Backward: PyTorch's autograd engine runs native backward nodes from C++, without Python frames
  (half the forward's cost per kernel); Megatron's and Transformer Engine's layers are custom
  ``autograd.Function``\\ s whose backward runs in Python (the forward's cost per kernel).
- compile: torch.compile's Inductor launches the fused kernels of a region from its generated wrapper, a few
  microseconds each with no per-op dispatch (``COMPILE_HOST_S_PER_KERNEL`` 6 us).
- cudagraph: the layer's kernels are replayed from a captured graph, one cudaGraphLaunch per layer and pass
  (``GRAPH_LAUNCH_S`` 10 us, whatever the kernel count; Megatron-Core's per-layer CudaGraphManager, Transformer
  Engine's make_graphed_callables).

A run's mode is its ``--launch`` condition, or by default its stack's: eager kernels launch eagerly, fused kernels
under a PyTorch-native stack are torch.compile's, fused kernels under Megatron launch eagerly (docs/formulas.md,
"The host floor"). The GPU-side gap between dependent kernels stays compute.py's (``kernel_overhead_s``); this
module prices only the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from meshplan.core.num import Num, maximum, where
from meshplan.core.time.compute import KERNELS_PER_LAYER
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Framework, Kernels

EAGER_HOST_S_PER_KERNEL = 30e-6
"""Host seconds per kernel of eager PyTorch or Megatron forward (gpt-fast's eager Llama-2-7B: 1.2 ms per layer of
about 40 kernels)."""
COMPILE_HOST_S_PER_KERNEL = 6e-6
"""Host seconds per kernel Inductor's generated wrapper launches."""
GRAPH_LAUNCH_S = 10e-6
"""Host seconds of one CUDA graph replay (a layer's pass)."""
NATIVE_BACKWARD_SHARE = 0.5
"""Host cost per backward kernel over the forward's, PyTorch's C++ autograd engine (no Python frames)."""
BACKWARD_KERNELS = 2.0
"""Backward kernels per forward kernel: an input and a weight gradient per matmul, a gradient per elementwise op."""
MOE_ROUTING_KERNELS = 16
"""Kernels a MoE layer's forward adds to a dense one: the router's matmul, softmax and top-k, the load-balancing
loss's reductions, the permutation of tokens to experts and back, the two all-to-alls, the expert activation."""
GROUPED_GEMMS = 2
"""Grouped expert matmuls of a MoE layer's forward (up and down), each one call of the inventory."""
EXPERT_LAUNCH_HOST_S = COMPILE_HOST_S_PER_KERNEL
"""Host seconds of each further expert's GEMM inside one grouped call under Megatron: Transformer Engine's
GroupedLinear (Megatron-Core's TEGroupedMLP) issues one cuBLAS GEMM per local expert from a C++ loop over four
streams (common/gemm/cublaslt_gemm.cu, multi_stream_cublas_gemm), a launch without Python's per-op dispatch, as
Inductor's wrapper issues its kernels (``COMPILE_HOST_S_PER_KERNEL``)."""


class Launch(StrEnum):
    """How the host issues a layer's kernels."""

    EAGER = "eager"
    """Op by op from Python (PyTorch eager, Megatron-LM, DeepSpeed)."""
    COMPILE = "compile"
    """torch.compile: fused kernels from Inductor's wrapper."""
    CUDAGRAPH = "cudagraph"
    """Replayed from a captured CUDA graph, one launch per layer and pass."""


def launch_of(stated: str | None, *, kernels: Kernels, framework: Framework) -> Launch:
    """The launch mode a run states, or its stack's: eager kernels eager; fused kernels compiled under a
    PyTorch-native stack, eager under Megatron."""
    if stated:
        return Launch(stated)
    if kernels is Kernels.FUSED and framework is Framework.TORCH:
        return Launch.COMPILE
    return Launch.EAGER


@dataclass(frozen=True, slots=True, kw_only=True)
class HostLayer:
    """Host seconds to issue one layer's kernels for one micro-batch, by pass."""

    forward_s: Num
    backward_s: Num


def layer_kernels(model: ModelSpec, *, kernels: Kernels, tp: Num, sp: Num, moe_layer: bool) -> Num:
    """Kernels one layer's forward issues: compute.py's inventory, the TP collectives, a MoE layer's routing."""
    collectives = where(tp > 1, where(sp, 4, 2), 0)
    routing = MOE_ROUTING_KERNELS if moe_layer and model.moe is not None else 0
    return KERNELS_PER_LAYER[kernels] + collectives + routing


def host_layer(
    model: ModelSpec,
    *,
    kernels: Kernels,
    launch: Launch,
    framework: Framework,
    tp: Num,
    sp: Num,
    moe_layer: bool,
    speed: float = 1.0,
    local_experts: Num = 1,
) -> HostLayer:
    """Host seconds of one layer's forward and backward (recompute issues the forward again), on hosts ``speed``
    times as fast as the measurements behind the constants (``Cluster.host_speed``). Under Megatron each of a MoE
    layer's grouped GEMMs launches one GEMM per ``local_experts`` (``EXPERT_LAUNCH_HOST_S`` for each past the
    first; backward twice as many, the input and weight gradients)."""
    if launch is Launch.CUDAGRAPH:
        one = GRAPH_LAUNCH_S / speed + 0.0 * tp
        return HostLayer(forward_s=one, backward_s=one)
    n = layer_kernels(model, kernels=kernels, tp=tp, sp=sp, moe_layer=moe_layer)
    per_kernel = (EAGER_HOST_S_PER_KERNEL if launch is Launch.EAGER else COMPILE_HOST_S_PER_KERNEL) / speed
    native = launch is Launch.EAGER and framework is Framework.TORCH
    backward_share = NATIVE_BACKWARD_SHARE if native else 1.0
    grouped = moe_layer and model.moe is not None and framework is Framework.MEGATRON
    experts = GROUPED_GEMMS * maximum(local_experts - 1, 0) * EXPERT_LAUNCH_HOST_S / speed if grouped else 0.0
    forward = n * per_kernel + experts
    return HostLayer(forward_s=forward, backward_s=BACKWARD_KERNELS * (n * per_kernel * backward_share + experts))


def host_stall_s(*, host_s: Num, gpu_s: Num) -> Num:
    """What the floor adds to ``gpu_s`` seconds of GPU work issued in ``host_s`` seconds: max(gpu, host) - gpu."""
    return maximum(host_s - gpu_s, 0.0)


SERVING_KERNELS_PER_LAYER = 10
"""Kernels a serving engine's decoder layer issues per forward, counted from vLLM's LlamaDecoderLayer
(vllm/model_executor/models/llama.py), not measured: the fused residual-add RMSNorm twice, the QKV, output,
gate-up and down GEMMs, rotary embedding, the KV-cache write (reshape_and_cache), the attention kernel, and
SiLU-and-mul. Tensor parallelism adds its 2 all-reduces."""
SERVING_MOE_EXTRA_KERNELS = 4
"""What a MoE layer adds to that count: its MLP's 3 kernels (gate-up, activation, down) become 7 (router GEMM,
top-k softmax, the token sort and alignment, 2 grouped GEMMs, the activation, the weighted sum of the experts'
outputs; vLLM's fused_moe path), and a shared expert is a dense MLP of 3 more."""


def serving_host_layer_s(model: ModelSpec, *, launch: Launch, tp: Num, moe_layer: bool) -> Num:
    """Host seconds to issue one serving layer's forward, by launch mode: 0 for replayed CUDA graphs (one launch a
    step; the in-graph floor is priced on the GPU side), else the kernels at ``EAGER_HOST_S_PER_KERNEL`` or
    ``COMPILE_HOST_S_PER_KERNEL`` each."""
    if launch is Launch.CUDAGRAPH:
        return 0.0 * tp
    n = SERVING_KERNELS_PER_LAYER + where(tp > 1, 2, 0)
    if moe_layer and model.moe is not None:
        n = n + SERVING_MOE_EXTRA_KERNELS + 3 * model.moe.num_shared_experts
    return n * (EAGER_HOST_S_PER_KERNEL if launch is Launch.EAGER else COMPILE_HOST_S_PER_KERNEL)
