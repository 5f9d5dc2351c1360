"""The stage-switch benchmark runs on the CPU with the tiny model and says its timings are not representative."""

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
