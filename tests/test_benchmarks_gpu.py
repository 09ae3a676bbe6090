"""``benchmarks/gpu.py --dry-run``: the GPU script's code runs on the CPU with tiny shapes.

No GPU is needed to build or test the book, so the one script that measures everything on a GPU
would rot unnoticed; this runs all of it (without CUDA graphs and fla's Triton kernels) into a
temporary folder and checks what it writes. Nothing is timed here.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
RESULTS = BENCHMARKS / "results"

pytest.importorskip("transformers")  # the decode part compares with Hugging Face's generate


def load_gpu_script():
    spec = importlib.util.spec_from_file_location("_gpu_benchmark", BENCHMARKS / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_dry_run")
    before = {p.name: p.stat().st_mtime_ns for p in RESULTS.glob("*")} if RESULTS.is_dir() else {}
    path_before = list(sys.path)
    try:
        run = load_gpu_script().main(["--dry-run", "--out", str(out)])
    finally:
        sys.path[:] = path_before
    after = {p.name: p.stat().st_mtime_ns for p in RESULTS.glob("*")} if RESULTS.is_dir() else {}
    return out, run, before, after


def read(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


def test_every_part_runs_and_writes_its_file(dry_run):
    out, run, _, _ = dry_run
    assert run["dry_run"] is True and run["device"] == "cpu"
    assert set(run["parts"]) == {"steps", "gates", "chunkwise", "decode", "crossover"}
    for name, part in run["parts"].items():
        assert part["status"] == "ok", (name, part)
        assert (out / part["file"]).is_file()
    assert read(out, "gpu_run_cuda.json")["parts"].keys() == run["parts"].keys()
    assert run["versions"]["torch"]


def test_dry_run_never_touches_the_results_folder(dry_run):
    _, _, before, after = dry_run
    assert after == before


def test_decode_steps_cover_every_memory_kind(dry_run):
    out, *_ = dry_run
    r = read(out, "decode_steps_cuda.json")
    methods = {row["method"] for row in r["rows"]}
    assert {"KV cache eager", "MLA layer eager", "MLA attention eager", "state (KDA, fp32) eager"} <= methods
    assert not any("CUDA graph" in m for m in methods)  # no graphs on a CPU
    for row in r["rows"]:
        assert "error" not in row, row
        assert row["median_s"] > 0 and row["bytes_read"] > 0
    kv = {row["N"]: row["bytes_read"] for row in r["rows"] if row["method"] == "KV cache eager" and row["B"] == 1}
    assert kv[64] == 4 * kv[16]  # the KV cache read grows with the context ...
    state = {row["bytes_read"] for row in r["rows"] if row["method"].startswith("state")
             and row["B"] == 1}
    assert len(state) == 1  # ... the state does not
    assert r["machine"]["device"] == "cpu"


def test_gates_compare_all_three_mixers_with_sdpa(dry_run):
    out, *_ = dry_run
    r = read(out, "gates_cuda.json")
    assert r["config"]["fla_error"] == "not used (dry run)"
    for T in r["config"]["Ts"]:
        methods = {row["method"] for row in r["rows"] if row["T"] == T and "median_s" in row}
        assert methods == {"DeltaNet ours eager", "Gated DeltaNet ours eager", "KDA ours eager", "causal SDPA"}
        for name in ("DeltaNet", "Gated DeltaNet", "KDA"):
            assert f"{name} ours eager / causal SDPA at T={T}" in r["summary"]


def test_chapter_files_have_the_keys_the_chapters_read(dry_run):
    out, *_ = dry_run
    decode = read(out, "decode_cuda.json")  # chapter 2: the roofline figure
    assert decode["tokens_identical"] is True
    assert {"context", "seconds", "roofline_seconds", "fast_seconds"} <= set(decode["step_vs_context"][0])
    assert decode["read_bandwidth_bytes_per_s"] > 0
    chunk = read(out, "chunkwise_cuda.json")  # chapter 5: the table of GPU runs
    assert chunk["rows"] and all({"T", "method"} <= set(row) for row in chunk["rows"])
    assert "gpu" in chunk["machine"] or chunk["machine"]["device"] == "cpu"
    cross = read(out, "crossover_cuda.json")  # chapter 3
    assert cross["benchmark"] == "crossover" and cross["head_dims"]


def test_refuses_to_run_without_a_gpu_or_an_out_folder():
    gpu = load_gpu_script()
    path_before = list(sys.path)
    try:
        with pytest.raises(SystemExit):
            gpu.main(["--dry-run"])  # a dry run must name its folder
        if not gpu.torch.cuda.is_available():
            with pytest.raises(SystemExit):
                gpu.main([])
        with pytest.raises(SystemExit):
            gpu.main(["--dry-run", "--out", "x", "--budget-s", "0"])
    finally:
        sys.path[:] = path_before
