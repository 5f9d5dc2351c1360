"""The stage-switch benchmark runs on the CPU with the tiny model and says its timings are not representative."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_dist_prints_stage_times_and_switches():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / "bench_dist.py"), "-c",
                          str(ROOT / "configs" / "tiny.yaml"),
                          "--seconds", "1"], capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert "devices: 1 x CPU (single process, sp=1); model: tiny" in out
    assert "NOT representative" in out
    rows = [line.split() for line in out.splitlines()]
    stages = {r[0]: int(r[1]) for r in rows if len(r) == 4 and r[0] in ("context", "a2v", "decode")}
    assert stages["context"] == stages["a2v"] >= 2  # every chunk ran its stages once
    for switch in ("context -> a2v", "a2v -> decode", "decode -> context"):
        assert any(line.startswith(switch) for line in out.splitlines()), switch


@pytest.mark.slow
def test_the_short_gpu_check_runs_through_on_a_cpu(tmp_path):
    """``scripts/gpu/gpu_check.sh OUT short`` is run on a lent GPU once, with no time to fix it there: each of its
    parts must run through here first (tiny models, the GPU-only levers left out) and leave its figures."""
    out, temp = tmp_path / "out", tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable, "SR_CONFIG": "configs/tiny-sr.yaml",
           "LOAD_ARGS": "--layers 2 --dim 256", "TMPDIR": str(temp)}
    log = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "gpu_check.sh"), str(out), "short"],
                         capture_output=True, text=True, timeout=600, env=env).stdout
    for part in ("sr", "sr_switches", "first_frame", "levers", "load"):
        assert f"=== {part}: exit 0" in log, log
    assert sorted(p.name for p in out.iterdir()) == ["clip.wav", "first_frame.json", "levers.json", "load.json",
                                                     "sr.json"]
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []  # (torch's own cache)
    pipeline = json.loads((out / "first_frame.json").read_text())["pipeline"]
    for mode in ("plain", "overlap_decode"):
        assert pipeline[mode]["warm"]["frames"] >= 3 * 16 and pipeline[mode]["warm"]["steady_fps"] > 0
    levers = {r["lever"] for r in json.loads((out / "levers.json").read_text())["passes"]}
    assert {"baseline", "cache_kv", "compile", "best"} <= levers
    assert [r["output"] for r in json.loads((out / "sr.json").read_text())] == ["64x64"]
