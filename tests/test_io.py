"""Loading and dumping: Hugging Face config.json import, TOML round trips, and clear errors on bad input."""

import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from meshplan.core.params import count_params
from meshplan.hf import model_from_hf_config
from meshplan.io import load_gpu, load_link, load_model, model_to_toml
from meshplan.spec.model import MLASpec, MlpKind, ModelSpec, MoESpec, NormKind

# config.json of meta-llama/Llama-3.1-8B as published on the Hugging Face Hub.
LLAMA_3_1_8B = json.loads("""{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}""")

# config.json of deepseek-ai/DeepSeek-V3 as published on the Hugging Face Hub (auto_map omitted).
DEEPSEEK_V3 = json.loads("""{
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "pretraining_tp": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
}""")


def test_real_llama_config_equals_catalog() -> None:
    assert model_from_hf_config(LLAMA_3_1_8B, name="llama-3.1-8b") == load_model("llama-3.1-8b")


def test_real_deepseek_config_equals_catalog() -> None:
    assert model_from_hf_config(DEEPSEEK_V3, name="deepseek-v3") == load_model("deepseek-v3")


def test_config_json_file_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "llama-3.1-8b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
    catalog = load_model("llama-3.1-8b")
    assert load_model(str(folder / "config.json")) == catalog  # the folder names the model
    assert load_model(str(folder)) == catalog
    (tmp_path / "mine.json").write_text(json.dumps(LLAMA_3_1_8B))
    assert load_model(str(tmp_path / "mine.json")).name == "mine"


# --- one small config per supported model_type ------------------------------------------------------------------

TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4, "intermediate_size": 96}
TINY |= {"vocab_size": 100, "max_position_embeddings": 128}


def spec(**fields: Any) -> ModelSpec:
    base: dict[str, Any] = dict(name="tiny", num_layers=4, hidden=64, num_heads=4, num_kv_heads=4, head_dim=16)
    return ModelSpec(**(base | dict(ffn_hidden=96, vocab_size=100, max_seq_len=128) | fields))


def hf(model_type: str, **extra: Any) -> ModelSpec:
    return model_from_hf_config(TINY | {"model_type": model_type} | extra, name="tiny")


def test_llama_defaults_and_biases() -> None:
    assert hf("llama") == spec()  # head_dim = hidden / heads, KV heads = heads, untied
    assert hf("llama", attention_bias=True, mlp_bias=True, num_key_value_heads=2, head_dim=32) == spec(
        qkv_bias=True, out_bias=True, mlp_bias=True, num_kv_heads=2, head_dim=32
    )
    assert hf("llama", tie_word_embeddings=True, head_dim=None).tied_embeddings


def test_mistral_window_covers_every_layer() -> None:
    assert hf("mistral", sliding_window=32) == spec(sliding_window=32, num_sliding_layers=4)
    assert hf("mistral", sliding_window=None) == spec()


def test_mixtral_experts() -> None:
    moe = MoESpec(num_experts=4, experts_per_token=2, expert_ffn_hidden=96)
    assert hf("mixtral", num_local_experts=4, num_experts_per_tok=2) == spec(moe=moe)


def test_qwen2_sliding_layers_follow_transformers() -> None:
    qkv = spec(qkv_bias=True)
    # use_sliding_window false: the window is ignored, whatever max_window_layers says
    assert hf("qwen2", sliding_window=32, max_window_layers=1) == qkv
    # on: layers with index >= max_window_layers slide, the first max_window_layers attend fully
    on = hf("qwen2", use_sliding_window=True, sliding_window=32, max_window_layers=1)
    assert (on.sliding_window, on.num_sliding_layers) == (32, 3)
    explicit = ["full_attention", "sliding_attention"] * 2
    assert hf("qwen2", use_sliding_window=True, sliding_window=32, layer_types=explicit).num_sliding_layers == 2


def test_qwen2_moe_shared_expert_and_dense_layers() -> None:
    moe_cfg = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=48)
    moe = MoESpec(
        num_experts=4,
        experts_per_token=2,
        expert_ffn_hidden=24,
        num_shared_experts=1,
        shared_ffn_hidden=48,
        shared_expert_gate=True,
        num_dense_layers=1,
    )
    assert hf("qwen2_moe", mlp_only_layers=[0], **moe_cfg) == spec(qkv_bias=True, moe=moe)
    with pytest.raises(ValueError, match=r"dense layers \[2\] are not a leading block"):
        hf("qwen2_moe", mlp_only_layers=[2], **moe_cfg)


def test_qwen3_head_dim_default_and_qk_norm() -> None:
    # transformers' Qwen3Config defaults head_dim to 128 (not hidden / heads)
    assert hf("qwen3") == spec(head_dim=128, qk_norm=True)
    assert hf("qwen3", head_dim=16, attention_bias=True) == spec(qk_norm=True, qkv_bias=True, out_bias=True)


def test_qwen3_moe() -> None:
    moe = MoESpec(num_experts=8, experts_per_token=2, expert_ffn_hidden=24)
    got = hf("qwen3_moe", head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24)
    assert got == spec(qk_norm=True, moe=moe)


MLA_CFG = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, q_lora_rank=None)
MLA_CFG |= dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, n_shared_experts=2)
MLA_CFG |= dict(first_k_dense_replace=1, num_key_value_heads=4)


def test_deepseek_v2_and_v3() -> None:
    mla = MLASpec(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
    moe = MoESpec(num_experts=4, experts_per_token=2, expert_ffn_hidden=24, num_shared_experts=2, num_dense_layers=1)
    v2 = hf("deepseek_v2", topk_method="group_limited_greedy", **MLA_CFG)
    assert v2 == spec(mla=mla, moe=moe)
    v3 = hf("deepseek_v3", num_nextn_predict_layers=1, **MLA_CFG)
    assert v3 == spec(mla=mla, moe=dataclasses.replace(moe, router_bias=True), mtp_layers=1)


def test_gpt2_small_counts_124m() -> None:
    # config.json of openai-community/gpt2; 124,439,808 is the element count of its checkpoint.
    config = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024}
    config |= {"n_ctx": 1024, "vocab_size": 50257, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}
    model = model_from_hf_config(config, name="gpt2")
    assert (model.mlp, model.norm, model.tied_embeddings, model.learned_positions) == (
        MlpKind.PLAIN,
        NormKind.LAYERNORM,
        True,
        1024,
    )
    assert model.qkv_bias and model.out_bias and model.mlp_bias and model.dropout
    assert model.ffn_hidden == 4 * 768
    assert count_params(model).total == 124_439_808


def test_gpt_neox_pythia_70m_counts() -> None:
    # config.json of EleutherAI/pythia-70m; the Pythia model table lists 70,426,624 parameters.
    config = {"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 6}
    config |= {"intermediate_size": 2048, "vocab_size": 50304, "max_position_embeddings": 2048}
    config |= {"rotary_pct": 0.25, "tie_word_embeddings": False, "use_parallel_residual": True}
    model = model_from_hf_config(config, name="pythia-70m")
    assert not model.tied_embeddings and model.learned_positions == 0 and model.norm is NormKind.LAYERNORM
    assert count_params(model).total == 70_426_624


# --- bad inputs -------------------------------------------------------------------------------------------------


def one_line_error(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ValueError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unsupported_model_type_names_the_supported_ones() -> None:
    message = one_line_error(model_from_hf_config, TINY | {"model_type": "bert"}, name="x")
    assert "unsupported model_type 'bert'" in message and "llama" in message and "deepseek_v3" in message
    assert "unsupported model_type None" in one_line_error(model_from_hf_config, TINY, name="x")


def test_hf_config_errors() -> None:
    missing = {k: v for k, v in TINY.items() if k != "hidden_size"} | {"model_type": "llama"}
    assert "'hidden_size' is missing" in one_line_error(model_from_hf_config, missing, name="x")
    wrong = TINY | {"model_type": "llama", "num_hidden_layers": "4"}
    assert "'num_hidden_layers' must be an integer" in one_line_error(model_from_hf_config, wrong, name="x")
    bad_gqa = TINY | {"model_type": "llama", "num_key_value_heads": 3}
    assert "num_kv_heads=3 must divide num_heads=4" in one_line_error(model_from_hf_config, bad_gqa, name="x")


def test_unknown_catalog_name_lists_the_closest() -> None:
    message = one_line_error(load_model, "llama3.1-8b")
    assert "unknown model 'llama3.1-8b'" in message and "llama-3.1-8b" in message
    assert "h100-sxm" in one_line_error(load_gpu, "h100")
    assert "unknown link" in one_line_error(load_link, "nvlink9000")


def test_file_errors(tmp_path: Path) -> None:
    assert "no such file" in one_line_error(load_model, str(tmp_path / "absent.toml"))
    assert "no such file" in one_line_error(load_model, str(tmp_path / "absent" / "config.json"))
    (tmp_path / "broken.json").write_text("{not json")
    assert "malformed JSON in broken.json" in one_line_error(load_model, str(tmp_path / "broken.json"))
    (tmp_path / "list.json").write_text("[1, 2]")
    assert "must hold a JSON object" in one_line_error(load_model, str(tmp_path / "list.json"))
    (tmp_path / "broken.toml").write_text("num_layers = = 3")
    assert "malformed TOML in broken.toml" in one_line_error(load_model, str(tmp_path / "broken.toml"))


GOOD_TOML = model_to_toml(load_model("mixtral-8x7b"))


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: "foo = 1\n" + t, "unknown key 'foo' in llama.toml (known: name, num_layers,"),
        (lambda t: t.replace("[moe]", "[moe]\nshared = 2"), "unknown key 'shared' in [moe] of llama.toml"),
        (lambda t: t.replace("num_layers = 32", 'num_layers = "32"'), "'num_layers' in llama.toml must be an integer"),
        (lambda t: t.replace('mlp = "gated"', 'mlp = "swiglu"'), "must be one of gated, plain, got 'swiglu'"),
        (lambda t: t.replace("hidden = 4096\n", ""), "missing key 'hidden' in llama.toml"),
        (lambda t: t.replace("tied_embeddings = false", "tied_embeddings = 0"), "must be true or false"),
        (lambda t: t.replace("num_kv_heads = 8", "num_kv_heads = 5"), "llama.toml: num_kv_heads=5 must divide"),
        (lambda t: t.replace("experts_per_token = 2", "experts_per_token = 9"), "[moe] of llama.toml: experts_per"),
    ],
)
def test_model_toml_errors(tmp_path: Path, edit: Any, expected: str) -> None:
    path = tmp_path / "llama.toml"
    path.write_text(edit(GOOD_TOML))
    assert expected in one_line_error(load_model, str(path))


def test_gpu_and_link_files(tmp_path: Path) -> None:
    gpu_file = tmp_path / "mygpu.toml"
    text = 'vendor = "x"\nhbm_bytes = 1e9\nhbm_bandwidth_bytes_per_s = 1e12\nscale_up_link = "pcie4"\n'
    text += 'scale_up_domain = 1\ngpus_per_node = 1\nscale_out_link = "eth-100g"\n[peak_flops]\nbf16 = 1e14\n'
    gpu_file.write_text(text)
    gpu = load_gpu(str(gpu_file))
    assert gpu.name == "mygpu" and gpu.calibration.matmul_efficiency_max == 0.80
    gpu_file.write_text(text + "bf17 = 1e14\n")
    assert "unknown dtype 'bf17' in [peak_flops] of mygpu.toml" in one_line_error(load_gpu, str(gpu_file))
    link_file = tmp_path / "mylink.toml"
    link_file.write_text('kind = "nvlink"\ntier = "sideways"\nbandwidth_bytes_per_s = 1e9\nefficiency = 1\n')
    assert "'tier' in mylink.toml must be one of scale-up, scale-out" in one_line_error(load_link, str(link_file))


# --- properties -------------------------------------------------------------------------------------------------


@st.composite
def model_specs(draw: st.DrawFn) -> ModelSpec:
    layers = draw(st.integers(1, 200))
    kv_heads = draw(st.integers(1, 16))
    window = draw(st.sampled_from([0, 0, 4096]))
    moe = None
    if draw(st.booleans()):
        experts = draw(st.integers(1, 512))
        moe = MoESpec(
            num_experts=experts,
            experts_per_token=draw(st.integers(1, experts)),
            expert_ffn_hidden=draw(st.integers(1, 10**5)),
            num_shared_experts=draw(st.integers(0, 4)),
            num_dense_layers=draw(st.integers(0, layers)),
            router_bias=draw(st.booleans()),
        )
    return ModelSpec(
        name=draw(st.text(min_size=1, max_size=20)),
        num_layers=layers,
        hidden=draw(st.integers(1, 10**6)),
        num_heads=kv_heads * draw(st.integers(1, 16)),
        num_kv_heads=kv_heads,
        head_dim=draw(st.integers(1, 512)),
        ffn_hidden=draw(st.integers(1, 10**6)),
        vocab_size=draw(st.integers(1, 10**6)),
        mlp=draw(st.sampled_from(MlpKind)),
        norm=draw(st.sampled_from(NormKind)),
        tied_embeddings=draw(st.booleans()),
        qkv_bias=draw(st.booleans()),
        sliding_window=window,
        num_sliding_layers=draw(st.integers(1, layers)) if window else 0,
        moe=moe,
        mtp_layers=draw(st.integers(0, 2)),
    )


@given(model_specs())
@example(spec(name='quote " backslash \\ tab \t del \x7f nul \x00 é'))
def test_toml_round_trip(model: ModelSpec) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.toml"
        path.write_text(model_to_toml(model), encoding="utf-8")
        assert load_model(str(path)) == model


def test_import_stays_light() -> None:
    code = "import sys, meshplan.io; sys.exit('numpy' in sys.modules)"
    root = Path(__file__).resolve().parent.parent
    assert subprocess.run([sys.executable, "-c", code], cwd=root, check=False).returncode == 0


def test_mpt_counts_the_llm_foundry_benchmark_models() -> None:
    """llm-foundry's benchmark table (scripts/train/benchmarking/README.md) lists NumParams per run: MPT-1B
    (d_model 2048, 16 heads, 24 layers) at 2,048 tokens has 1,315,950,592 and at 1,024 tokens 1,313,853,440 (the
    learned position table has max_seq_len rows); MPT-7B at 2,048 tokens 6,658,859,008. Those runs kept the biases;
    by hand, per layer 12h^2 + 13h (QKV, out, up, down weights and biases, two LayerNorms), plus the tied vocabulary,
    the position table and the final LayerNorm."""
    for h, heads, layers, seq, published in (
        (2048, 16, 24, 2048, 1_315_950_592),
        (2048, 16, 24, 1024, 1_313_853_440),
        (4096, 32, 32, 2048, 6_658_859_008),
    ):
        config = {"model_type": "mpt", "d_model": h, "n_heads": heads, "n_layers": layers, "expansion_ratio": 4}
        config |= {"max_seq_len": seq, "vocab_size": 50368, "no_bias": False, "attn_config": {"alibi": False}}
        by_hand = layers * (12 * h * h + 13 * h) + 50368 * h + seq * h + 2 * h
        assert by_hand == published
        model = model_from_hf_config(config, name="mpt")
        assert count_params(model).total == published
    # MPT-7B as published (mosaicml/mpt-7b config.json): no biases, ALiBi, a 50,432-token vocabulary
    config = {"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4}
    config |= {"max_seq_len": 2048, "vocab_size": 50432, "no_bias": True, "learned_pos_emb": False}
    model = model_from_hf_config(config, name="mpt-7b")
    assert not (model.qkv_bias or model.out_bias or model.mlp_bias) and model.learned_positions == 0
    assert model.mlp is MlpKind.PLAIN and model.tied_embeddings


def test_mpt_refuses_a_bad_expansion_ratio() -> None:
    config = {"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 100}
    assert "expansion_ratio" in one_line_error(model_from_hf_config, config | {"expansion_ratio": "x"}, name="m")


def test_gpt_oss_config_equals_catalog() -> None:
    """The fields of openai/gpt-oss-120b's config.json that the import reads (quantization and rope settings
    left out): alternating sliding and full layers, biases everywhere, a sink per head."""
    config = {"model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880, "intermediate_size": 2880}
    config |= {"num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088}
    config |= {"num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4, "sliding_window": 128}
    config |= {"layer_types": ["sliding_attention", "full_attention"] * 18, "attention_bias": True}
    config |= {"attention_dropout": 0.0, "max_position_embeddings": 131072, "tie_word_embeddings": False}
    assert model_from_hf_config(config, name="gpt-oss-120b") == load_model("gpt-oss-120b")
