"""Workload: what is trained, on what data shape, with what numerics."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from meshplan.spec.conditions import Conditions, Fp8Recipe
from meshplan.spec.finetune import Finetune
from meshplan.units import DTYPE_BYTES, DType


class Attention(StrEnum):
    """Attention kernel, which decides whether the s x s score matrix is stored."""

    FLASH = "flash"
    """Fused attention, no score matrix, only a log-sum-exp per row: the stack's kernel on the GPU kind (PyTorch,
    compiled or not, and eager kernels: SDPA's FlashAttention-2; Transformer Engine: the kind's fused kernel,
    cuDNN's on Hopper)."""
    FA1 = "fa1"
    """Fused, FlashAttention (Dao et al. 2022), flash-attn 1.x."""
    FA_TRITON = "fa-triton"
    """Fused, flash-attn's Triton kernel (llm-foundry's attn_impl: triton, 2023)."""
    FA2 = "fa2"
    """Fused, FlashAttention-2 (Dao 2023)."""
    FA3 = "fa3"
    """Fused, FlashAttention-3 (Shah et al. 2024; Hopper)."""
    CUDNN = "cudnn"
    """Fused, cuDNN's flash attention (Transformer Engine's FusedAttention; Hopper)."""
    EAGER = "eager"
    """Unfused attention: scores, softmax and its dropout are kept (the 2022 Megatron runs)."""

    @property
    def fused(self) -> bool:
        """No s x s score matrix is stored (every kernel but the eager one)."""
        return self is not Attention.EAGER


class Framework(StrEnum):
    """The training framework whose kernels and collectives a prediction describes."""

    MEGATRON = "megatron"
    """Megatron-LM / Megatron-Core: fused kernels, fused QKV and gate/up projections, vocab-parallel loss,
    sequence parallelism that saves sharded inputs and gathers them again in backward."""
    TORCH = "torch"
    """PyTorch-native training as torchtitan composes it: DDP, FSDP2 (``fully_shard``), DTensor tensor and
    sequence parallelism, ``torch.distributed.pipelining``; eager norms, separate projections, no loss
    parallelism (docs/check.md lists every difference)."""


class Kernels(StrEnum):
    """How elementwise work around the matmuls runs, which decides what the MLP keeps and how often HBM is read."""

    FUSED = "fused"
    """Fused kernels (Megatron-LM / Transformer Engine / torch.compile): a gated MLP keeps its two inputs and
    its product; norms and activations read and write each tensor once."""
    EAGER = "eager"
    """Plain PyTorch ops: a gated MLP also keeps act(gate); each op reads and writes its own tensors."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionPolicy:
    """Dtype of every copy of the model the training state keeps."""

    name: str
    compute: DType = DType.BF16
    """Matmul input dtype: picks the tensor-core peak."""
    weights: DType = DType.BF16
    """The parameters the forward pass reads."""
    master: DType | None = DType.FP32
    """A separate higher-precision copy the optimizer updates (None: the weights are the master)."""
    grads: DType = DType.BF16
    """Gradient buffers (fp32 when gradients accumulate in fp32)."""
    moments: DType = DType.FP32
    """Optimizer moments."""
    activations: DType = DType.BF16
    """Activations saved for backward."""
    description: str = ""

    @property
    def weight_bytes(self) -> float:
        return DTYPE_BYTES[self.weights]

    @property
    def master_bytes(self) -> float:
        return 0.0 if self.master is None else DTYPE_BYTES[self.master]

    @property
    def grad_bytes(self) -> float:
        return DTYPE_BYTES[self.grads]

    @property
    def moment_bytes(self) -> float:
        return DTYPE_BYTES[self.moments]

    @property
    def activation_bytes(self) -> float:
        return DTYPE_BYTES[self.activations]


PRECISIONS: dict[str, PrecisionPolicy] = {
    p.name: p
    for p in (
        PrecisionPolicy(
            name="bf16",
            description="bf16 weights and gradients, fp32 master weights and Adam moments (16 bytes/param)",
        ),
        PrecisionPolicy(
            name="bf16-fp32-grads",
            grads=DType.FP32,
            description="as bf16 but gradients accumulate in fp32 (Megatron main_grad, Llama 3): 18 bytes/param",
        ),
        PrecisionPolicy(
            name="fp16",
            compute=DType.FP16,
            weights=DType.FP16,
            grads=DType.FP32,
            activations=DType.FP16,
            description="fp16 mixed precision with fp32 main gradients, as the 2021-22 Megatron runs (18 bytes/param)",
        ),
        PrecisionPolicy(
            name="fsdp2-bf16",
            weights=DType.FP32,
            master=None,
            grads=DType.FP32,
            description="FSDP2 MixedPrecisionPolicy(param_dtype=bf16): fp32 sharded parameters and gradients, "
            "bf16 only while gathered (16 bytes/param)",
        ),
        PrecisionPolicy(
            name="fp8",
            compute=DType.FP8,
            description="FP8 matmuls (Transformer Engine) on a bf16 policy: 16 bytes/param",
        ),
        PrecisionPolicy(
            name="deepseek-fp8",
            compute=DType.FP8,
            grads=DType.FP32,
            moments=DType.BF16,
            description="DeepSeek-V3: FP8 matmuls, fp32 master weights and gradients, bf16 moments (14 bytes/param)",
        ),
        PrecisionPolicy(
            name="fp32",
            compute=DType.TF32,
            weights=DType.FP32,
            master=None,
            grads=DType.FP32,
            activations=DType.FP32,
            description="plain fp32 training on TF32 tensor cores (16 bytes/param)",
        ),
    )
}


MAX_STATE_BYTES = 64.0
"""Optimizer-state bytes per parameter at most (AdamW in fp32 with fp32 master weights: 12)."""


class OptimizerKind(StrEnum):
    """Optimizer, which decides the state kept per parameter."""

    ADAMW = "adamw"
    """Adam / AdamW: two moments per parameter."""
    SGD_MOMENTUM = "sgd-momentum"
    """SGD with momentum: one moment per parameter."""
    SGD = "sgd"
    """Plain SGD: no state."""
    ADAFACTOR = "adafactor"
    """Adafactor without momentum: factored second moment (a row and a column vector per matrix)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Optimizer:
    """The optimizer, or an explicit state size."""

    kind: OptimizerKind = OptimizerKind.ADAMW
    state_bytes_per_param: float | None = None
    """Overrides the moments' bytes per parameter (master weights are counted apart)."""

    def __post_init__(self) -> None:
        value = self.state_bytes_per_param
        if value is not None and not 0 <= value <= MAX_STATE_BYTES:  # also refuses NaN and infinities
            raise ValueError(f"optimizer state bytes per parameter must be in [0, {MAX_STATE_BYTES:g}], got {value}")

    @property
    def num_moments(self) -> int:
        """Full-size moment tensors per parameter (Adafactor's factored moment counts as 0)."""
        return {OptimizerKind.ADAMW: 2, OptimizerKind.SGD_MOMENTUM: 1}.get(self.kind, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Overlap:
    """Which communication the engine runs concurrently with compute."""

    dp: bool = True
    """Data-parallel gradient reduction overlaps the backward pass (DDP buckets, FSDP reduce-scatter)."""
    param_gather: bool = True
    """ZeRO-1/2 parameter all-gather after the optimizer overlaps the next forward."""
    fsdp_prefetch: bool = True
    """ZeRO-3 all-gathers of the next layer overlap the current layer's compute."""
    tp: bool = False
    """TP collectives overlap their matmuls (async TP / comm-GEMM fusion); off: forward TP traffic is exposed."""
    tp_backward: bool = True
    """The backward all-reduce of input gradients overlaps the weight-gradient matmul (Megatron default)."""
    pp: bool = True
    """Pipeline sends and receives overlap compute in the interleaved schedule."""
    cp: bool = True
    """Ring attention hides each K/V transfer behind the previous block's attention."""
    ep: bool = False
    """MoE all-to-alls overlap compute (DeepSeek's DualPipe pairs a forward and a backward chunk)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What one training step processes."""

    seq_len: int
    global_batch: int
    """Sequences per optimizer step, over all data-parallel ranks."""
    precision: PrecisionPolicy = field(default_factory=lambda: PRECISIONS["bf16"])
    optimizer: Optimizer = field(default_factory=Optimizer)
    attention: Attention = Attention.FLASH
    kernels: Kernels = Kernels.FUSED
    overlap: Overlap = field(default_factory=Overlap)
    framework: Framework = Framework.MEGATRON
    finetune: Finetune = field(default_factory=Finetune)
    """What trains: everything (pre-training), LoRA or QLoRA adapters, or all but frozen parts."""
    conditions: Conditions = field(default_factory=Conditions)
    """How the run was set up beyond its layout (from its stack and flags): loss, gradient sync, reserves."""

    def __post_init__(self) -> None:
        for name in ("seq_len", "global_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.conditions.fp8_recipe is not None and self.precision.compute is not DType.FP8:
            raise ValueError(
                f"fp8_recipe {self.conditions.fp8_recipe} needs FP8 matmuls (precision fp8 or deepseek-fp8), "
                f"got precision {self.precision.name}"
            )
        if self.conditions.fp8_recipe is Fp8Recipe.MXFP8 and self.precision.name != "fp8":
            raise ValueError(
                f"fp8_recipe mxfp8 needs precision fp8 (deepseek-fp8 is its own block recipe: 128 x 128 weights), "
                f"got precision {self.precision.name}"
            )
        if self.conditions.fp8_all_gather and self.precision.compute is not DType.FP8:
            raise ValueError(
                f"fp8_all_gather needs FP8 matmuls (precision fp8 or deepseek-fp8), got precision {self.precision.name}"
            )
        if self.conditions.fp8_dispatch and self.precision.compute is not DType.FP8:
            raise ValueError(
                f"fp8_dispatch needs FP8 matmuls (precision fp8 or deepseek-fp8), got precision {self.precision.name}"
            )

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def attention_span(self) -> int:
        """Tokens a causal query's attention spans at most: the sequence, or its document when sequences are
        packed documents with attention kept inside each (``Conditions.doc_tokens``)."""
        doc = self.conditions.doc_tokens
        return self.seq_len if doc is None else min(self.seq_len, doc)
