"""A real Slurm run: scripts/slurm/slurm_check.sh starts a single-node Slurm from the OS packages, submits the
batch example as an array over a manifest and checks the outputs (each job rendered by one task, the
second submission skipping all of them)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MISSING = [tool for tool in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(tool) is None]


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.skipif(
    bool(MISSING), reason=f"Slurm is not installed (no {', '.join(MISSING)}): apt-get install -y slurm-wlm munge"
)
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the single-node Slurm's daemons run as root")
def test_slurm_array_over_a_manifest(tmp_path):
    ctld, slurmd = free_ports(2)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "slurm" / "slurm_check.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable, "SLURMCTLD_PORT": str(ctld), "SLURMD_PORT": str(slurmd)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("Slurm check passed"), done.stdout
    assert not (tmp_path / "slurm" / "slurmctld.pid").exists()  # the daemons were stopped
