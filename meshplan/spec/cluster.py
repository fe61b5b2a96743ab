"""Hardware: GPUs, links and the fleet they form.

All bandwidths are bytes/s per GPU and per direction (the figure collective
bus-bandwidth models use); capacities are bytes. Vendor GB are 10**9 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from meshplan.units import DType


class LinkKind(StrEnum):
    """Physical family of an interconnect."""

    NVLINK = "nvlink"
    """NVIDIA NVLink / NVSwitch scale-up fabric."""
    XGMI = "xgmi"
    """AMD Infinity Fabric links between GPUs of one node."""
    PCIE = "pcie"
    """PCI Express through the host (no GPU-to-GPU fabric)."""
    INFINIBAND = "infiniband"
    """InfiniBand RDMA between nodes."""
    ROCE = "roce"
    """RDMA over converged Ethernet between nodes."""
    ETHERNET = "ethernet"
    """Plain TCP Ethernet between nodes."""


class LinkTier(StrEnum):
    """Where a group of GPUs talks: inside one scale-up domain or across the fabric."""

    SCALE_UP = "scale-up"
    """Inside one NVLink / xGMI domain."""
    SCALE_OUT = "scale-out"
    """Across nodes, over the NICs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """One interconnect, seen from one GPU."""

    name: str
    kind: LinkKind
    tier: LinkTier
    bandwidth_bytes_per_s: float
    """Nominal bandwidth per GPU, per direction."""
    efficiency: float
    """Share of the nominal bandwidth a large collective reaches (nccl-tests bus bandwidth)."""
    latency_s: float
    """Start-up cost of one step of a collective (the alpha of the alpha-beta model)."""
    switched: bool = True
    """Scale-up links that meet in a switch (NVSwitch): any group inside the domain gets the whole bandwidth.
    False: links wired GPU to GPU, one bundle to each peer (AMD's xGMI boards), so ``bandwidth_bytes_per_s`` is
    the sum over every peer of the domain and a smaller group reaches only its own peers' share."""
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_per_s <= 0:
            raise ValueError(f"link {self.name}: bandwidth must be positive, got {self.bandwidth_bytes_per_s}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"link {self.name}: efficiency must be in (0, 1], got {self.efficiency}")
        if self.latency_s < 0:
            raise ValueError(f"link {self.name}: latency must be >= 0, got {self.latency_s}")

    @property
    def effective_bytes_per_s(self) -> float:
        """Bandwidth a large collective really gets."""
        return self.bandwidth_bytes_per_s * self.efficiency


class AttentionKernel(StrEnum):
    """A fused attention kernel generation (published tables in core/time/attention_kernels.py)."""

    FA1 = "fa1"
    """FlashAttention (Dao et al. 2022), the first version (flash-attn 1.x)."""
    FA_TRITON = "fa-triton"
    """flash-attn's Triton FlashAttention kernel (llm-foundry's attn_impl: triton)."""
    FA2 = "fa2"
    """FlashAttention-2 (Dao 2023); PyTorch's SDPA flash backend."""
    FA3 = "fa3"
    """FlashAttention-3 (Shah et al. 2024): Hopper's asynchronous warp-specialized kernel."""
    CUDNN = "cudnn"
    """cuDNN's fused flash attention (Transformer Engine's FusedAttention on Hopper)."""


ATTENTION_GENERATIONS = ("ampere", "hopper")
MLA_DECODE_KERNELS = ("flashmla",)
"""Published absorbed-MLA decode kernels whose rates serving knows (core/serving/phases.py)."""
"""GPU generations with published fused-attention tables."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuCalibration:
    """Per-GPU-kind constants of the step-time and memory models, each with its source.

    These are data of the GPU kind, never fitted to one published run. The
    defaults of the software-side constants (half dimension, HBM efficiency,
    kernel gap, pipeline step overhead, overlap efficiency) were fitted over
    the 18 A100 runs of Korthikanti et al. 2022 and Narayanan et al. 2021
    (benchmarks/calibrate.py) and serve every kind; matmul and attention
    efficiency are set per kind in the catalog.
    """

    matmul_efficiency_max: float = 0.80
    """Best fraction of dense peak a large GEMM reaches (maximum achievable matmul FLOPs)."""
    matmul_half_dim: float = 16.0
    """GEMM dimension at which that dimension alone halves efficiency: each of M, N, K scales it by d/(d + this)."""
    sm_count: int = 132
    """Streaming multiprocessors (compute units): a GEMM with fewer output tiles than this leaves some idle."""
    attention_efficiency: float = 0.35
    """Fraction of dense peak a fused (flash) attention kernel reaches in forward at long sequences (serving's
    prefill reads it; training reads the published kernel tables of ``attention_generation``)."""
    attention_generation: str = "hopper"
    """Whose published fused-attention tables (core/time/attention_kernels.py) describe this kind: ampere (A100)
    or hopper (H100); a kind without tables of its own takes the nearest generation's shares of peak."""
    mla_decode_kernel: str | None = None
    """The published decode kernel of multi-head latent attention that runs on this kind (flashmla: the SM90 dies,
    H100, H200, H800), whose rates serving takes for an MLA model's decode attention; None: none published here,
    the engine family's attention and cache-read shares."""
    fused_attention_kernel: str = "cudnn"
    """The fused attention kernel of Megatron stacks with fused kernels (Transformer Engine picks cuDNN's on Hopper
    and FlashAttention-2 on Ampere); PyTorch-native stacks, compiled or not, and eager ones run SDPA's flash
    backend, FlashAttention-2."""
    attention_scale: float = 1.0
    """Multiplies the tables' shares of peak: 1 on the kinds the tables were measured on."""
    fp8_matmul_ratio: float = 0.8965
    """The FP8 plateau's share of FP8 peak over the bf16 plateau's share of bf16 peak: the measured maximum
    achievable matmul FLOPs (MAMF) in each, each over the GEMM shape law's factor at K = N = 16,384 for its dtype
    (FP8's ridge point is twice bf16's, so a large FP8 GEMM sits further below its plateau). H100 SXM: FP8 1,402.6
    of 1,978.8 (0.709) over bf16 794.5 of 989.4 (0.803) = 0.883 (published_runs.json hw_H100_SXM,
    stas00/ml-engineering MAMF table), x 0.9847 / 0.9699 = 0.8965; the default for kinds without an FP8
    measurement."""
    hbm_efficiency: float = 0.80
    """Fraction of HBM bandwidth memory-bound kernels reach."""
    kernel_overhead_s: float = 4e-6
    """Launch and scheduling gap per kernel, paid by every op of every layer."""
    pipeline_step_overhead_s: float = 1.5e-3
    """Fixed cost of each forward or backward chunk a pipeline stage runs (schedule sync, launch gaps)."""
    overlap_efficiency: float = 0.6
    """Share of communication run beside compute that really hides (NCCL kernels take SMs from the matmuls)."""
    tp_overlap_efficiency: float = 0.75
    """The same share for TP collectives overlapped with their GEMMs (Transformer Engine's userbuffers
    comm-GEMM overlap, async TP), which move data with few SMs or the copy engines: fitted by
    benchmarks/calibrate.py over the 16 runs with TP overlap on (Megatron-Core H100 weak scaling, NeMo 24.07;
    grid 0.6-0.95, the least mean over the 16, docs/validation.md), once the row-parallel output-gradient
    all-gather was counted overlapped as userbuffers runs it (0.9 before, with that all-gather exposed)."""
    framework_bytes: float = 1.5e9
    """CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers resident on every GPU."""
    fragmentation: float = 0.05
    """Caching-allocator fragmentation, as a fraction of dynamic memory."""
    source: str = ""

    def __post_init__(self) -> None:
        shares = ("matmul_efficiency_max", "attention_efficiency", "hbm_efficiency", "overlap_efficiency")
        for name in shares:
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"calibration {name} must be in (0, 1], got {getattr(self, name)}")
        kernels = [k.value for k in AttentionKernel]
        if self.fused_attention_kernel not in kernels:
            raise ValueError(
                f"calibration fused_attention_kernel must be one of {kernels}, got {self.fused_attention_kernel!r}"
            )
        if self.attention_generation not in ATTENTION_GENERATIONS:
            raise ValueError(
                f"calibration attention_generation must be one of {list(ATTENTION_GENERATIONS)}, "
                f"got {self.attention_generation!r}"
            )
        if self.mla_decode_kernel is not None and self.mla_decode_kernel not in MLA_DECODE_KERNELS:
            raise ValueError(
                f"calibration mla_decode_kernel must be one of {list(MLA_DECODE_KERNELS)}, "
                f"got {self.mla_decode_kernel!r}"
            )
        if not 0 < self.attention_scale <= 2:
            raise ValueError(f"calibration attention_scale must be in (0, 2], got {self.attention_scale}")
        if self.sm_count < 1:
            raise ValueError(f"calibration sm_count must be >= 1, got {self.sm_count}")
        for name in ("matmul_half_dim", "kernel_overhead_s", "pipeline_step_overhead_s", "framework_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"calibration {name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.fragmentation < 1:
            raise ValueError(f"calibration fragmentation must be in [0, 1), got {self.fragmentation}")


@dataclass(frozen=True, slots=True, kw_only=True)
class GPU:
    """One accelerator kind."""

    name: str
    vendor: str
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    peak_flops: Mapping[DType, float]
    """Dense (no sparsity) peak FLOP/s per compute dtype."""
    scale_up_link: str
    """Name of the link inside the scale-up domain (links catalog)."""
    scale_up_domain: int
    """GPUs per NVLink / xGMI domain (8 for HGX, 72 for NVL72)."""
    gpus_per_node: int
    """GPUs per host, which share the host's NICs."""
    scale_out_link: str
    """Name of the default per-GPU NIC link (links catalog)."""
    calibration: GpuCalibration = field(default_factory=GpuCalibration)
    block_scaled_mma: bool = False
    """The tensor cores apply a scale per block of operand elements inside the matmul (NVIDIA Blackwell's
    tcgen05 block-scaled MMA, whose MXFP8 runs at the FP8 rate): the kinds that can run ``--fp8-recipe mxfp8``."""
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.hbm_bytes <= 0 or self.hbm_bandwidth_bytes_per_s <= 0:
            raise ValueError(f"gpu {self.name}: HBM capacity and bandwidth must be positive")
        if DType.BF16 not in self.peak_flops:
            raise ValueError(f"gpu {self.name}: peak_flops must give bf16")
        if any(not flops > 0 for flops in self.peak_flops.values()):
            raise ValueError(f"gpu {self.name}: every peak_flops value must be positive")
        if self.scale_up_domain < 1 or self.gpus_per_node < 1:
            raise ValueError(f"gpu {self.name}: scale_up_domain and gpus_per_node must be >= 1")

    def peak(self, dtype: DType) -> float:
        """Dense peak FLOP/s of matmuls in ``dtype``; fp16 falls back on bf16."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if dtype is DType.FP16:
            return self.peak_flops[DType.BF16]
        raise ValueError(f"gpu {self.name} has no {dtype} tensor-core peak (has {', '.join(self.peak_flops)})")


from meshplan.spec.requests import MAX_GPUS  # noqa: E402  the one fleet bound, declared with the inputs


def check_gpus(num_gpus: int) -> int:
    """``num_gpus`` if it is a fleet size meshplan plans for, else ValueError naming the bound."""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise ValueError(f"gpus must be a positive integer, got {num_gpus!r}")
    if num_gpus > MAX_GPUS:
        raise ValueError(f"gpus={num_gpus:,} is above the limit of {MAX_GPUS:,}")
    return num_gpus


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """A fleet of identical GPUs: scale-up domains joined by a scale-out fabric."""

    gpu: GPU
    num_gpus: int
    scale_up: Link
    scale_out: Link
    domain_size: int
    """GPUs that share the scale-up link (one NVLink domain)."""
    oversubscription: float = 1.0
    """Hosts' NIC bandwidth under a leaf switch over the leaf's uplinks (1: a non-blocking fat tree). Rings and
    trees pass data between neighbouring nodes along one rail; an all-to-all spreads over every node, so its
    bytes that leave the domain share the uplinks."""
    step_overhead_s: float = 0.0
    """Host-side seconds every training step pays that no GPU term prices (data loading, logging, metric syncs,
    the training loop's own Python): 0 in the catalog; a cluster profile fitted on measured runs sets it
    (``Profile.step_overhead_s``)."""
    scale_up_switched: bool = True
    """The scale-up domain is a switch (NVSwitch, NVL72): a group of any size inside it gets each GPU's whole
    scale-up bandwidth. False: a board of direct links (NVIDIA's 4-GPU HGX boards: 12 NVLink 3 links on A100 and 18
    NVLink 4 on H100/H200 split evenly over the 3 peers), where a group of n of the domain's D GPUs reaches only
    the links to its own n - 1 peers, (n - 1) / (D - 1) of the GPU's bandwidth (core/comm/call.py
    ``scale_up_share``): NCCL's
    topology gives each GPU pair an edge of its own links' bandwidth (src/graph/topo.cc), and its rings and trees
    cannot route one pair's traffic over another's links."""
    host_speed: float = 1.0
    """How fast the hosts issue kernels over the catalog's per-launch-mode costs (core/time/host.py): their seconds
    per kernel are divided by it; 1 in the catalog, a cluster profile fitted on host-bound runs sets it
    (``Profile.host_scale``)."""

    def __post_init__(self) -> None:
        check_gpus(self.num_gpus)
        if not 0 < self.host_speed < float("inf"):
            raise ValueError(f"host_speed must be a finite number > 0, got {self.host_speed}")
        if self.domain_size < 1:
            raise ValueError(f"domain_size must be >= 1, got {self.domain_size}")
        if not self.oversubscription >= 1:
            raise ValueError(f"oversubscription must be >= 1 (1: non-blocking), got {self.oversubscription}")
        if not 0 <= self.step_overhead_s < float("inf"):
            raise ValueError(f"step_overhead_s must be a finite number of seconds >= 0, got {self.step_overhead_s}")
