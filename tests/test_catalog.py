"""The shipped catalog: every file loads, names match, links resolve, units are the documented ones."""

from pathlib import Path

import pytest

from meshplan.exports import check_model_path
from meshplan.io import (
    list_gpus,
    list_links,
    list_models,
    load_gpu,
    load_link,
    load_model,
    model_meta,
    model_to_toml,
)
from meshplan.spec.cluster import LinkKind, LinkTier
from meshplan.units import DType

REQUIRED_MODELS = {
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.3-70b",
    "llama-3.1-405b",
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "mistral-7b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen2.5-7b",
    "qwen2.5-72b",
    "qwen3-235b-a22b",
    "deepseek-v3",
    "gpt3-175b",
    "megatron-22b",
    "megatron-530b",
    "megatron-1t",
}
REQUIRED_GPUS = {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h800", "h200", "b200", "gb200"}
REQUIRED_GPUS |= {"mi300x", "mi325x", "l40s"}
# Per GPU, per direction, bytes/s.
REQUIRED_LINKS = {
    "nvlink3": 300e9,
    "nvlink4": 450e9,
    "nvlink5": 900e9,
    "nvlink4-h800": 200e9,
    "ib-hdr": 25e9,
    "ib-ndr": 50e9,
    "ib-xdr": 100e9,
    "roce-400g": 50e9,
    "eth-100g": 12.5e9,
    "eth-400g": 50e9,
    "pcie4": 31.5e9,
    "pcie5": 63e9,
    "xgmi-mi300": 448e9,
}


def test_required_names_exist() -> None:
    assert not REQUIRED_MODELS - set(list_models())
    assert not REQUIRED_GPUS - set(list_gpus())
    assert not set(REQUIRED_LINKS) - set(list_links())


@pytest.mark.parametrize("name", list_models())
def test_model_loads_and_round_trips(name: str, tmp_path: Path) -> None:
    model = load_model(name)
    assert model.name == name
    path = tmp_path / f"{name}.toml"
    path.write_text(model_to_toml(model), encoding="utf-8")
    assert load_model(str(path)) == model
    # the [meta] table rides along without changing the spec
    path.write_text(model_to_toml(model, meta=model_meta(name)), encoding="utf-8")
    assert load_model(str(path)) == model


@pytest.mark.parametrize("name", list_models())
def test_model_meta_names_a_source(name: str) -> None:
    meta = model_meta(name)
    assert meta["source"]
    known = {"source", "hf_repo", "published_total_params", "params_source", "notes"}
    known |= {"published_weights_dtype", "published_weights_source"}  # a model released quantized (serve-plan)
    assert set(meta) <= known
    if "hf_repo" in meta:  # only the repository whose config.json the entry was read from (the source says so)
        assert f"HF {meta['hf_repo']} config.json" in meta["source"]
        assert check_model_path(meta["hf_repo"]) and meta["hf_repo"].count("/") == 1
    if "published_total_params" in meta:
        assert isinstance(meta["published_total_params"], int)
        assert meta["params_source"]
    if "published_weights_dtype" in meta:
        assert meta["published_weights_source"]


def test_sliding_and_moe_shapes() -> None:
    mistral = load_model("mistral-7b")
    assert (mistral.sliding_window, mistral.num_sliding_layers) == (4096, 32)
    assert load_model("qwen2.5-7b").num_sliding_layers == 0  # use_sliding_window is false in its config
    deepseek = load_model("deepseek-v3")
    assert deepseek.moe is not None and deepseek.mla is not None
    assert (deepseek.moe.num_dense_layers, deepseek.moe.router_bias, deepseek.mtp_layers) == (3, True, 1)
    gpt3 = load_model("gpt3-175b")
    assert (gpt3.vocab_size, gpt3.learned_positions, gpt3.tied_embeddings, gpt3.dropout) == (50257, 2048, True, True)


@pytest.mark.parametrize("name", ["megatron-22b", "megatron-530b", "megatron-1t"])
def test_megatron_models_follow_korthikanti_table3(name: str) -> None:
    # Korthikanti et al. 2022 Table 3 (published_runs.json korthikanti_table3_configs): heads, hidden, layers.
    table3 = {"megatron-22b": (64, 6144, 48), "megatron-530b": (128, 20480, 105), "megatron-1t": (160, 25600, 128)}
    model = load_model(name)
    assert (model.num_heads, model.hidden, model.num_layers) == table3[name]
    assert (model.vocab_size, model.learned_positions, model.ffn_hidden) == (51200, 2048, 4 * model.hidden)


@pytest.mark.parametrize("name", list_gpus())
def test_gpu_loads_and_its_links_exist(name: str) -> None:
    gpu = load_gpu(name)
    assert gpu.name == name
    assert load_link(gpu.scale_up_link).tier is LinkTier.SCALE_UP
    assert load_link(gpu.scale_out_link).tier is LinkTier.SCALE_OUT
    assert gpu.scale_up_domain % gpu.gpus_per_node == 0 or gpu.gpus_per_node % gpu.scale_up_domain == 0
    assert gpu.source and gpu.calibration.source
    assert all(isinstance(dtype, DType) for dtype in gpu.peak_flops)
    if DType.FP8 in gpu.peak_flops:  # dense fp8 is about twice dense bf16 (L40S: 733 vs 362.05)
        assert gpu.peak_flops[DType.FP8] == pytest.approx(2 * gpu.peak_flops[DType.BF16], rel=0.02)


def test_hbm_is_what_the_driver_reports() -> None:
    """nvidia-smi's totals (MiB): an "80 GB" H100 shows 81,559 MiB (85.5e9 bytes), not 80e9."""
    mib = 2**20
    assert load_gpu("h100-sxm").hbm_bytes == 81_559 * mib == pytest.approx(85.52e9, rel=1e-4)
    assert load_gpu("h800").hbm_bytes == 81_559 * mib
    assert load_gpu("a100-80gb").hbm_bytes == 81_920 * mib
    assert load_gpu("a100-40gb").hbm_bytes == 40_960 * mib
    assert load_gpu("h200").hbm_bytes == 143_771 * mib
    assert load_gpu("b200").hbm_bytes == 183_359 * mib
    assert load_gpu("l40s").hbm_bytes == 46_068 * mib


@pytest.mark.parametrize(
    ("name", "mamf_flops", "peak_flops"),
    [
        ("h100-sxm", 794.5e12, 989.4e12),
        ("b200", 1745e12, 2250e12),
        ("gb200", 1822e12, 2500e12),
        ("mi300x", 668.4e12, 1307.4e12),
    ],
)
def test_sustained_matmul_efficiency_is_below_the_published_maximum(
    name: str, mamf_flops: float, peak_flops: float
) -> None:
    """Training sustains less than the maximum achievable matmul throughput (MAMF) of the part."""
    gpu = load_gpu(name)
    assert gpu.peak(DType.BF16) == peak_flops
    mamf = mamf_flops / peak_flops
    assert 0.5 * mamf < gpu.calibration.matmul_efficiency_max < mamf
    assert "MAMF" in gpu.calibration.source


def test_special_topologies() -> None:
    gb200 = load_gpu("gb200")
    assert (gb200.scale_up_domain, gb200.gpus_per_node, gb200.scale_up_link) == (72, 4, "nvlink5")
    l40s = load_gpu("l40s")
    assert l40s.scale_up_link == "pcie4" and l40s.scale_up_domain == l40s.gpus_per_node
    assert load_link("pcie4").kind is LinkKind.PCIE
    h800 = load_link(load_gpu("h800").scale_up_link)
    assert h800.bandwidth_bytes_per_s == 200e9


@pytest.mark.parametrize("name", list_links())
def test_link_loads(name: str) -> None:
    link = load_link(name)
    assert link.name == name and link.source
    assert 0 < link.efficiency <= 1 and 0 < link.latency_s < 1e-4
    if name in REQUIRED_LINKS:
        assert link.bandwidth_bytes_per_s == REQUIRED_LINKS[name]


def test_catalog_file_names_match_their_name_key() -> None:
    root = Path(__file__).resolve().parent.parent / "meshplan" / "catalog"
    for kind, names in (("models", list_models()), ("gpus", list_gpus()), ("links", list_links())):
        assert sorted(p.stem for p in (root / kind).glob("*.toml")) == names


def test_run_and_recipe_files_hold_only_schema_keys() -> None:
    """Every published run (catalog/runs) and recipe is what a user could type: besides what identifies it and
    what was measured, its keys are schema fields (the overlap of each axis as overlap_<axis> = "on"/"off",
    never an ``overlap`` table), and its layout table holds the schema's layout fields."""
    from meshplan.reports.inputs import LayoutRequest
    from meshplan.reports.recipes import recipes
    from meshplan.spec import requests
    from meshplan.validation.training import RUN_KEYS, case_values, sources

    schema = {f.name for f in requests.FIELDS}
    cases = [{**data.get("defaults", {}), **case} for data in sources().values() for case in data["case"]]
    assert len(cases) == 258  # 212 in-house runs and the 46 of the released sources (published_runs_3.json)
    for case in cases:
        assert set(case) - set(RUN_KEYS) <= schema, case["id"]
        case_values(case)  # parsed and bounded by the schema
        LayoutRequest.parse(case["layout"])
    for name, recipe in recipes().items():
        extra = set(recipe) - schema - {"title", "source", "why", "model", "model_overrides", "layout", "published"}
        assert not extra, name
        run = sources()[recipe["published"]["run"]]  # every recipe names the catalog run that measured it
        assert [c["id"] for c in run["case"]].count(recipe["published"]["case"]) == 1, name
    with pytest.raises(ValueError, match="unknown run key 'overlap'"):
        case_values({"id": "x", "overlap": {"dp": False}})


def test_a_recipe_with_a_key_outside_the_schema_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshplan.reports import recipes as module

    monkeypatch.setattr(module.io, "catalog_tables", lambda folder: {"x": {"title": "x", "overlap_dp": "on", "tp": 2}})
    module.recipes.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"unknown key 'tp' in recipe x\.toml"):
            module.recipes()
    finally:
        module.recipes.cache_clear()
