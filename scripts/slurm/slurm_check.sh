#!/usr/bin/env bash
# A real Slurm run of the batch example: starts a single-node Slurm (scripts/slurm/local_cluster.sh),
# submits scripts/slurm/batch_array.sbatch as an array of 2 tasks over a manifest of 5 jobs, and checks
# that every video is there with its frame count, each job rendered by exactly one task. Then submits
# the array again: everything is skipped and nothing is touched.
#
#   sudo scripts/slurm/slurm_check.sh [WORK_DIR]      # as root, from a checkout with .venv (scripts/test.sh makes it)
#
# Needs: apt-get install -y slurm-wlm munge. Ports: SLURMCTLD_PORT, SLURMD_PORT (6817, 6818).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
py=${PYTHON:-$root/.venv/bin/python}
work=${1:-$(mktemp -d -t avatar-slurm-XXXXXX)}
mkdir -p "$work"
work=$(cd "$work" && pwd)
scripts/slurm/local_cluster.sh start "$work/slurm"
trap 'scripts/slurm/local_cluster.sh stop "$work/slurm"' EXIT
export SLURM_CONF="$work/slurm/slurm.conf"
export AVATAR_RENDER="$py -m avatar_render" PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

"$py" - "$work" <<'PY'
import sys
from pathlib import Path
from avatar_render.bench import loop_speech
work = Path(sys.argv[1])
(work / "jobs").mkdir(exist_ok=True)
rows = ["ref,audio,output"]
for i, seconds in enumerate((1.0, 1.5, 2.0, 2.5, 3.0)):
    loop_speech(Path("examples/talk.wav"), seconds, work / "jobs" / f"clip{i}.wav")
    rows.append(f"{Path('examples/face.png').resolve()},clip{i}.wav,clip{i}.mp4")
(work / "jobs" / "jobs.csv").write_text("\n".join(rows) + "\n")
PY

submit() {  # the array, then wait for all its tasks (polling: sbatch --wait checks only every few tens of seconds)
  local id
  id=$(sbatch --parsable --array=0-1 --chdir="$work" --output="$work/task-%a.$1.out" scripts/slurm/batch_array.sbatch \
    "$work/jobs/jobs.csv" "$work/renders" video.width=128 video.height=128)
  echo "submitted array job $id (sbatch --array=0-1 scripts/slurm/batch_array.sbatch jobs.csv renders ...)"
  while squeue -h -j "$id" 2>/dev/null | grep -q .; do sleep 0.5; done
  scontrol -o show job "$id" | sed -E 's/.*ArrayTaskId=([0-9]+).*JobState=([A-Z]+).*/  array task \1: \2/'
  ! scontrol -o show job "$id" | grep -v 'JobState=COMPLETED' | grep -q .
}
t0=$(date +%s.%N)
submit first || { cat "$work"/task-*.first.out; echo "Slurm check FAILED: the array did not succeed"; exit 1; }
t1=$(date +%s.%N)
stat -c '%n %s %Y %y' "$work"/renders/*.mp4 > "$work/after-first.txt"
submit second || { cat "$work"/task-*.second.out; echo "Slurm check FAILED: the second submission did not succeed"; exit 1; }
t2=$(date +%s.%N)
stat -c '%n %s %Y %y' "$work"/renders/*.mp4 | cmp -s - "$work/after-first.txt" \
  || { echo "Slurm check FAILED: the second submission touched the videos"; exit 1; }

"$py" - "$work" "$t0" "$t1" "$t2" <<'PY'
import json, math, sys
from pathlib import Path
import av
work = Path(sys.argv[1]); t0, t1, t2 = map(float, sys.argv[2:])
parts = [json.loads((work / "renders" / f"batch-summary.shard-{i}-of-2.json").read_text()) for i in range(2)]
names = [[j["name"] for j in p["jobs"]] for p in parts]
print(f"array task 0 rendered {names[0]}, task 1 {names[1]}")
assert sorted(names[0] + names[1]) == [f"clip{i}" for i in range(5)], names  # disjoint and covering
assert all(j["status"] == "skipped" for p in parts for j in p["jobs"]), "the second submission rendered again"
for i, seconds in enumerate((1.0, 1.5, 2.0, 2.5, 3.0)):
    with av.open(str(work / "renders" / f"clip{i}.mp4")) as c:
        frames = sum(1 for _ in c.decode(video=0))
    assert frames == math.ceil(seconds * 25), (i, frames)
    print(f"clip{i}.mp4: {frames} frames ({seconds:g} s at 25 fps)")
print(f"first submission: 5 jobs in {t1 - t0:.1f} s over 2 array tasks; second: all 5 skipped in {t2 - t1:.1f} s")
print("Slurm check passed")
PY
