"""The cross-entropy's peak under PyTorch's loss_parallel, measured on CPU and held against the bill.

torchtitan computes ``cross_entropy(pred.float(), labels)`` on vocabulary-sharded DTensor logits inside
``loss_parallel()`` whenever TP > 1. DTensor runs that loss as Python code on each rank's shard
(torch/distributed/tensor/parallel/loss.py): forward ``shifted = x - max``, ``exp(shifted)``, ``shifted - lse``;
backward ``(zeros_like(x) + exp(x)) * grad`` with -1 scattered into the zeros. Counted by hand, in bytes per token
and local vocabulary entry beyond the bf16 logits (which torchtitan deletes before backward):
- forward: the fp32 upcast x (4), shifted (4), exp(shifted) (4), then the log-probabilities in exp's place: 12;
- backward: the saved log-probabilities (4), the zeros (4), their sum with exp (4, exp's 4 freed after the sum)
  and the product with the gradient (4): 16, the peak.
aten's fused kernels without loss_parallel peak at 12 (conditions.UPCAST_LOSS_BYTES). The test runs both on a
one-rank gloo group, counting the live storages of every tensor an op returns (the loss-parallel handlers
re-enter the counter, so the temporaries inside them are seen), and holds the bill to the count.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest

from meshplan import io
from meshplan.core.memory.stage_activations import loss_peak_bytes
from meshplan.reports.inputs import LayoutRequest, resolve_layout, resolve_workload
from meshplan.spec.conditions import PARALLEL_UPCAST_LOSS_BYTES, UPCAST_LOSS_BYTES, Conditions, LossKind

torch = pytest.importorskip("torch", reason="the measurement needs torch")
dist = pytest.importorskip("torch.distributed")

TOKENS, VOCAB = 128, 1024


def _peak_counter() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class PeakCounter(TorchDispatchMode):
        """Peak bytes held at once by the storages of the tensors it has seen (each storage once)."""

        def __init__(self) -> None:
            super().__init__()
            self.refs: list[weakref.ref[Any]] = []
            self.peak = 0

        def watch(self, t: Any) -> None:
            self.refs.append(weakref.ref(t))

        def live(self) -> int:
            held: dict[int, int] = {}
            for ref in self.refs:
                t = ref()
                if t is None:
                    continue
                t = getattr(t, "_local_tensor", t)
                storage = t.untyped_storage()
                held[storage._cdata] = storage.nbytes()
            return sum(held.values())

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.watch(t)
            self.peak = max(self.peak, self.live())
            return out

    return PeakCounter()


@contextmanager
def _one_rank_group() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already up in this interpreter")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _loss_peak_per_entry(parallel: bool) -> float:
    """Peak bytes per token and vocabulary entry of forward + backward of the upcast loss, beyond the logits."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss as lp

    torch.manual_seed(0)
    pred = torch.randn(TOKENS, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (TOKENS,))
    counter = _peak_counter()
    counter.watch(pred)
    names = ("_log_softmax", "_nll_loss_forward", "_nll_loss_and_log_softmax_backward")
    saved: dict[str, Callable[..., Any]] = {}
    if parallel:  # the handlers' local ops run below DTensor's dispatch: count them too
        for name in names:
            saved[name] = getattr(lp, name)

            def counted(*a: Any, _f: Callable[..., Any] = saved[name], **k: Any) -> Any:
                with counter:
                    return _f(*a, **k)

            setattr(lp, name, counted)
    try:
        logits = DTensor.from_local(pred, init_device_mesh("cpu", (1,)), [Shard(1)]) if parallel else pred
        base = counter.live()
        with lp.loss_parallel() if parallel else nullcontext(), counter:
            loss = torch.nn.functional.cross_entropy(logits.float(), labels)
            del logits
            loss.backward()
    finally:
        for name, f in saved.items():
            setattr(lp, name, f)
    return (counter.peak - base) / (TOKENS * VOCAB)


def test_the_upcast_loss_peaks_at_12_bytes_and_16_under_loss_parallel() -> None:
    with _one_rank_group():
        plain, parallel = _loss_peak_per_entry(False), _loss_peak_per_entry(True)
    assert plain == pytest.approx(UPCAST_LOSS_BYTES, abs=0.05)
    assert parallel == pytest.approx(PARALLEL_UPCAST_LOSS_BYTES, abs=0.05)


V = 128256


@pytest.mark.parametrize(
    ("framework", "tp", "parallel", "expected"),
    [
        # PyTorch under TP with loss parallelism (torchtitan's default): the DTensor loss on the vocabulary shard
        ("torch", 8, True, 16 * 8192 * V / 8),
        ("torch", 8, False, 12 * 8192 * V),  # loss parallelism off: every rank gathers all V
        ("torch", 1, True, 12 * 8192 * V),  # no TP: torchtitan enters no loss_parallel context
        ("megatron", 8, True, 12 * 8192 * V / 8),  # an upcast loss on Megatron's own vocabulary split
    ],
)
def test_the_bill_takes_the_loss_parallel_peak(framework: str, tp: int, parallel: bool, expected: float) -> None:
    model = io.load_model("llama-3.1-8b")
    lay = resolve_layout(LayoutRequest(tp=tp), gpus=tp)
    cond = Conditions(loss=LossKind.UPCAST, loss_parallel=parallel)
    work = resolve_workload(layout=lay, seq=8192, global_batch=1, framework=framework, conditions=cond)
    assert float(loss_peak_bytes(model, tokens=8192, tp=tp, workload=work)) == pytest.approx(expected)
