"""Hostile ``--from`` files get one line on stderr and exit code 2: never a traceback, a hang or unbounded memory.
And any text at all, read as any kind, is a reading or a ValueError (the CLI's one line), nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.cli import main
from meshplan.configs import KINDS, read_config_text
from meshplan.configs.torchtitan import READ_SECTIONS

GOOD_DS = '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}}'


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, body: str | bytes, *extra: str) -> str:
    path = tmp_path / name
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    rc = main(["estimate", "--from", str(path), "--gpu", "h100-sxm", *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_truncated_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "ds.json", GOOD_DS[:40], "llama-3.1-8b")
    assert "malformed JSON" in err


def test_a_toml_of_unknown_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "job.toml", "[training]\nseq_len = 4096\n[rocket]\nfuel = 3\n")
    assert "[rocket] is not a section of torchtitan's job config" in err
    err = _refused(tmp_path, capsys, "job.toml", "[parallelism]\ntensor_parallel_degreee = 8\n")
    assert "parallelism.tensor_parallel_degreee is not a key" in err


def test_ten_megabytes_of_junk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "junk.toml", os.urandom(10 * 1024 * 1024))
    assert "the limit is" in err


def test_a_yaml_bomb_and_deep_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n'
    err = _refused(tmp_path, capsys, "bomb.yaml", "trainer:\n  devices: 8\n" + bomb, "--from-kind", "nemo")
    assert "anchors and aliases are not read" in err
    deep = "".join(f"{' ' * i}k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n"
    err = _refused(tmp_path, capsys, "deep.yaml", "trainer:\n" + deep, "--from-kind", "nemo")
    assert "nests more than" in err


def test_a_repeated_yaml_key_and_a_tag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "twice.yaml", "distributed_type: FSDP\ndistributed_type: NO\n", "llama-3.1-8b")
    assert "appears twice" in err
    err = _refused(tmp_path, capsys, "tag.yaml", "trainer:\n  devices: !!python/object:os.system ls\n")
    assert "tags are not read" in err


def test_megatron_flags_that_disagree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(
        tmp_path,
        capsys,
        "a.sh",
        "torchrun pretrain_gpt.py --num-layers 32 --tensor-model-parallel-size 2 --tensor-model-parallel-size 4\n",
    )
    assert "is given twice" in err
    err = _refused(tmp_path, capsys, "b.sh", 'torchrun pretrain_gpt.py --num-layers 32 --seq-length "4096\n')
    assert "unbalanced quotes" in err


def test_a_shape_no_catalog_model_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "c.sh", "pretrain_gpt.py --num-layers 7 --hidden-size 999 --seq-length 64\n")
    assert "names no model meshplan knows" in err
    err = _refused(tmp_path, capsys, "d.sh", "pretrain_gpt.py --num-layers 80 --seq-length 64\n", "llama-3.1-8b")
    assert "states num_layers = 80, but model llama-3.1-8b has 32" in err


def test_a_config_json_is_not_an_engine_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "config.json", '{"model_type": "llama", "hidden_size": 4096}')
    assert "give it as MODEL" in err


def test_python_is_read_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    body = f"import os\nos.system('touch {marker}')\n\ndef f():\n    config = llama3_8b()\n    return config\n"
    _refused(tmp_path, capsys, "evil.py", body.replace("config = llama3_8b()", "config = os.system('x')"))
    assert not marker.exists()
    err = _refused(
        tmp_path, capsys, "odd.py", "def f():\n    config = llama3_8b()\n    config.training.seq_len = g()\n"
    )
    assert "is not a literal value" in err


def test_the_wrong_command_kind_and_unknown_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "serve.sh", "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2\n")
    assert "is a serving config (vllm): read it with serve or serve-plan" in err
    err = _refused(tmp_path, capsys, "what.txt", "hello world\n")
    assert "give --from-kind" in err
    err = _refused(tmp_path, capsys, "ds.json", GOOD_DS, "--from-kind", "caffe")
    assert "is not one of torchtitan" in err


def test_too_many_unread_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = "{" + ",".join(f'"k{i}": {i}' for i in range(1000)) + "}"
    err = _refused(tmp_path, capsys, "ds.json", body, "llama-3.1-8b")
    assert "keys meshplan does not read" in err


def test_a_folder_and_a_fifo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["estimate", "--from", str(tmp_path), "--gpu", "h100-sxm"])
    assert rc == 2 and "is a folder" in capsys.readouterr().err
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    rc = main(["estimate", "--from", str(fifo), "--gpu", "h100-sxm"])
    assert rc == 2 and "not a regular file" in capsys.readouterr().err


@given(st.sampled_from(KINDS), st.text(max_size=400))
def test_any_text_is_read_or_refused_with_a_value_error(kind: str, text: str) -> None:
    try:
        read = read_config_text(text, "fuzz", kind)
    except ValueError as exc:
        assert "\n" not in str(exc).strip()
        return
    assert read.kind == kind


@given(
    st.sampled_from(["nemo", "accelerate", "megatron", "vllm"]),
    st.text(alphabet=" -:[]{},'\"#\n\tab1&*!|>=$\\", max_size=300),
)
def test_yaml_and_shell_punctuation_is_read_or_refused(kind: str, text: str) -> None:
    try:
        read_config_text(text, "fuzz", kind)
    except ValueError as exc:
        assert "\n" not in str(exc).strip()


# Files made of the keys each reader knows, holding values of every type in the wrong places: a reading or one line.
_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(-1e3, 1e3, allow_nan=False),
    st.sampled_from(["on", "bf16", "float32", "full", "selective", "x", "-1", "auto", "fp8", "block", "never"]),
    st.lists(st.sampled_from(["loss", "model", "float8", 1]), max_size=3),
)


def _refused_or_read(text: str, kind: str) -> None:
    try:
        read_config_text(text, "fuzz", kind)
    except ValueError as exc:
        assert "\n" not in str(exc).strip()


@given(
    st.dictionaries(
        st.sampled_from(["training", "parallelism", "activation_checkpoint", "model", "compile"]),
        st.dictionaries(st.sampled_from(sorted(set().union(*READ_SECTIONS.values()))), _LEAF, max_size=5),
        max_size=3,
    )
)
def test_torchtitan_keys_with_any_values(d: dict) -> None:
    import json

    def value(v: object) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return (
            "true"
            if v is True
            else "false"
            if v is False
            else repr(v)
            if isinstance(v, int | float)
            else json.dumps("none" if v is None else v)
        )

    _refused_or_read(
        "".join(f"[{s}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in t.items()) for s, t in d.items()), "torchtitan"
    )


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "train_batch_size",
                "train_micro_batch_size_per_gpu",
                "bf16",
                "optimizer",
                "zero_optimization",
                "tensor_parallel",
                "communication_data_type",
            ]
        ),
        st.one_of(
            _LEAF, st.dictionaries(st.sampled_from(["stage", "enabled", "autotp_size", "type"]), _LEAF, max_size=3)
        ),
        max_size=6,
    )
)
def test_deepspeed_keys_with_any_values(d: dict) -> None:
    import json

    _refused_or_read(json.dumps(d), "deepspeed")


@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "--tensor-model-parallel-size",
                    "--recompute-granularity",
                    "--recompute-num-layers",
                    "--bf16",
                    "--fp8-format",
                    "--nnodes",
                    "--nproc-per-node",
                    "--num-distributed-optimizer-instances",
                    "--use-distributed-optimizer",
                    "--sgd-momentum",
                    "--optimizer",
                ]
            ),
            st.sampled_from(["", "1", "0", "-1", "x", "full", "block", "sgd", "1e3"]),
        ),
        max_size=10,
    )
)
def test_megatron_flags_with_any_values(pairs: list) -> None:
    _refused_or_read("pretrain_gpt.py " + " ".join(f"{f} {v}".strip() for f, v in pairs), "megatron")


def test_an_output_never_overwrites_the_from_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "recipe.yaml"
    text = "trainer:\n  devices: 8\ndata:\n  seq_length: 4096\n  global_batch_size: 64\n"
    path.write_text(text)
    rc = main(["plan", "llama-3.1-8b", "--from", str(path), "--gpu", "h100-sxm", "--save", str(path), "--force"])
    err = capsys.readouterr().err
    assert rc == 2 and "is a file this command reads" in err
    assert path.read_text() == text
