"""Regenerate the files in tests/data/traces/ from `meshplan check`'s own torch.distributed runs on CPU.

    PYTHONPATH=$PWD python tests/data/traces/make_traces.py

Runs the harness's `ddp` and `fsdp` layouts on 2 local gloo processes (meshplan/check/runner.py, with
``trace_dir``), keeps rank 0's files (check/trace.py says what each is) and writes the tiny model's TOML, so that
`meshplan compare` can be typed against them. The numbers differ from run to run (wall times); the shapes and
the collective counts do not.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from meshplan.check.runner import run_check

HERE = Path(__file__).parent
LAYOUTS = ("ddp", "fsdp")
TINY_MODEL = """# The harness's tiny Llama (meshplan/check/shapes.py DENSE), as `meshplan compare` plans them.
name = "tiny-llama"
num_layers = 4
hidden = 32
num_heads = 8
num_kv_heads = 4
head_dim = 4
ffn_hidden = 64
vocab_size = 50
mlp = "gated"
norm = "rmsnorm"
tied_embeddings = false
max_seq_len = 16
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        run_check(2, list(LAYOUTS), trace_dir=out)
        for name in LAYOUTS:
            for suffix in ("trace.json", "snapshot.pickle", "logged.json"):
                shutil.copy(Path(out, f"{name}_rank0.{suffix}"), HERE / f"{name}_rank0.{suffix}")
    (HERE / "tiny-llama.toml").write_text(TINY_MODEL)
    for path in sorted(HERE.iterdir()):
        print(f"{path.stat().st_size:>10,}  {path.name}")


if __name__ == "__main__":
    main()
