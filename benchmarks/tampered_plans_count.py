"""How many tampered serving plans ``meshplan export ENGINE --from-plan`` lets through.

Run from a checkout: ``PYTHONPATH=$PWD python benchmarks/tampered_plans_count.py [ENGINE ...]``. It saves two
plans with serve-plan (one colocated, one with split prefill/decode pools), tampers each field of each in turn
(tests/exports/tampered_plans.py) and exports every tampered file: a plan gets through when the export exits 0;
a traceback is any exception other than a refusal (exit 2).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "exports")]

from tampered_plans import tampered  # noqa: E402

from meshplan.cli import main  # noqa: E402

BASES = {
    "colocated": ["llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "1024", "--output-len", "256",
                  "--allow-quantization"],
    "split": ["llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "8000", "--output-len", "300",
              "--tpot-p99", "0.02", "--weights-dtypes", "fp8", "--allow-quantization", "--search-disaggregated"],
}  # fmt: skip


def run(argv: list[str]) -> tuple[int | str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: int | str = main(argv)
        except Exception as exc:  # a traceback: what the CLI must never show
            code = f"traceback ({type(exc).__name__})"
    return code, err.getvalue()


def main_count(engines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for base, argv in BASES.items():
            saved = folder / f"{base}.json"
            code, err = run(["serve-plan", *argv, "--save", str(saved)])
            assert code == 0, err
            plan = json.loads(saved.read_text())
            cases = tampered(plan)
            for engine in engines:
                through, tracebacks, names = 0, 0, []
                for name, text in cases.items():
                    path = folder / "tampered.json"
                    path.write_text(text)
                    code, _ = run(["export", engine, "--from-plan", str(path), "--json"])
                    if code == 0:
                        through += 1
                        names.append(name)
                    elif code != 2:
                        tracebacks += 1
                        names.append(f"{name}: {code}")
                counts = f"{through} of {len(cases)} tampered plans exported, {tracebacks} tracebacks"
                print(f"{base} plan, {engine}: {counts}")
                for name in names:
                    print(f"    {name}")


if __name__ == "__main__":
    main_count(sys.argv[1:] or ["vllm", "sglang", "trtllm"])
