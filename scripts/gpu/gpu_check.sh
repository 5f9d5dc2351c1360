#!/usr/bin/env bash
# Every GPU check of the diffusion backend in one run, with random full-size bf16 weights (speed does
# not depend on the weights' values). Each part has its own time limit and log, so one failure does
# not lose the others' figures. Needs PyTorch with CUDA and the project's dependencies importable.
#
#   scripts/gpu/gpu_check.sh [OUT_DIR]        # figures and logs in OUT_DIR (default gpu-results)
#
# 1. render: the CLI end to end (flashtalk recipe, 640x640) on a few seconds of the example audio: time
#    to first frame, generated fps, per-stage seconds, peak GPU memory; the MP4 is decoded back.
# 2. switches: per-stage times, time to first frame, peak GPU memory per process and the visible
#    overhead of each stage switch (scripts/bench/bench_dist.py), DiT resident and DiT offloaded, and the
#    40-step recipe at 480p and 720p; with several GPUs under torchrun over all of them.
# 3. speed: DiT pass / step / chunk, VAE decode, achieved TFLOP/s, peak memory at 480p and 720p, for
#    the InfiniteTalk (40 steps, 3 passes) and FlashTalk (4 steps, 1 pass) recipes; DiT resident and
#    streamed block by block from pinned host memory (scripts/gpu/gpu_check.py).
# 4. speed_compiled: the DiT passes at 480p with each block compiled (torch.compile), against eager.
# 5. sr: the SR stage at full size (scripts/gpu/gpu_check.py --sr): SwiftVR's chunk (ReAE encode, one DiT
#    pass, ReAE decode) at 1280x720 and 1920x1080 output from 640x352 and 960x528, SR fps, peak memory,
#    the SR DiT resident and streamed from host memory, the face guard, and the 2x decoder (the cheap path).
# 6. sr_render: the CLI end to end with configs/flashtalk-sr720p.yaml (generate 640x352, publish 1280x720):
#    the MP4 decoded back at 1280x720, and the report's stage seconds with decode and sr.
# 7. sr_switches: per-stage times and switches with SR in the loop (a2v -> decode -> sr -> context),
#    scripts/bench/bench_dist.py on configs/flashtalk-sr720p.yaml, SR DiT resident and offloaded.
# SKIP_SPEED=1 / SKIP_COMPILE=1 / SKIP_SR=1 leave parts 3 / 4 / 5-7 out.
#
#   scripts/gpu/gpu_check.sh [OUT_DIR] firstframe   # only issue 19's checks, in under 10 minutes (about 9):
#
# F1. levers (scripts/gpu/gpu_levers.py, limit 300 s): one full-size DiT pass at the FlashTalk shapes (the
#     short first chunk, 2 latents; a later chunk, 9 latents) at 640x640 and 768x448, for the eager
#     baseline and each lever alone (cache_kv, each SDPA backend, compiled blocks, fp8 with torchao, a
#     CUDA graph) and all that help together: ms per pass, TFLOP/s, MFU against the dense bf16 peak,
#     FLOPs counted against by hand, and the generated fps of a 4-step chunk (plus the VAE decode, also
#     timed); then the FlashTalk pipeline run twice in one process, with run.overlap_decode off and on:
#     warm time to first frame and to the first sampled frames (ms and DiT tokens before them), fps.
# F2. first_frame (scripts/bench/bench_first_frame.py, limit 200 s): the CLI render of 2 s with the FlashTalk
#     recipe, chunk.first_frames=0 (as before) and 4: time to first frame in s and DiT tokens, the first
#     sampled frames, the seam after the first chunk against the others, generated fps.
# F3. load (scripts/bench/bench_load.py, limit 80 s): 4 of the 14B DiT's 40 blocks written as 7 shards and read
#     back one file after the other to the host then the GPU (before) and side by side straight to the
#     GPU (now): seconds and GB/s, and what that makes of the 40-block DiT.
#
#   scripts/gpu/gpu_check.sh OUT_DIR short   # the headline figures in about 8 minutes, into OUT_DIR:
#
# S1. sr (limit 90 s): part 5 above (SwiftVR at 720p and 1080p output, resident and streamed, the guard, the
#     2x decoder) -> OUT_DIR/sr.json.
# S2. sr_switches (limit 110 s): part 7 above, SR DiT resident (per-stage ms, switches, first frame, peak GPU);
#     SR_CONFIG=configs/tiny-sr.yaml (with LOAD_ARGS="--layers 2 --dim 256") rehearses the mode on a CPU.
# S3. first_frame (limit 170 s): F1's pipeline part alone (gpu_levers.py --pipeline-only, three full chunks a
#     request): cold and warm first frame, first sampled frames, fps with run.overlap_decode off and on.
# S4. levers (limit 170 s): F1's passes at 768x448 only (each lever alone, then all that help) -> OUT_DIR/levers.json.
# S5. load (limit 45 s): F3 with 2 blocks -> OUT_DIR/load.json.
# Only the JSON files and the output are written under OUT_DIR (the parts' logs go to a temporary folder).
# The figures go to docs/gpu_levers_<gpu>.json, docs/gpu_first_frame_<gpu>.json and docs/gpu_load_<gpu>.json
# (docs/benchmarks.md, "First frame and throughput levers", says how to read them), the logs to OUT_DIR.
set -u
out=${1:-gpu-results}
only=${2:-all}
mkdir -p "$out"
py=${PYTHON:-python3}
seconds=${SECONDS_OF_AUDIO:-6}
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."

logs=$out
if [ "$only" = short ]; then
  logs=$(mktemp -d)
  trap 'rm -rf "$logs"' EXIT
fi
part() {  # part NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 t=$SECONDS
  shift 2
  echo "=== $name"
  timeout "$limit" "$@" 2>&1 | tee "$logs/$name.log"
  echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t)) s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
nvidia-smi topo -m 2>&1 | head -8 || true
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"

"$py" - "$seconds" "$out/clip.wav" <<'EOF'
import sys, wave
seconds, dst = float(sys.argv[1]), sys.argv[2]
with wave.open("examples/talk.wav") as src, wave.open(dst, "wb") as w:
    w.setparams(src.getparams())
    w.writeframes(src.readframes(int(seconds * src.getframerate())))
EOF
box='face.box=[178,69,92,92]'  # the example face: no face-detector files needed on the GPU machine
if [ "$only" = short ]; then
  part sr "${SR_LIMIT:-90}" "$py" scripts/gpu/gpu_check.py --sr --out "$out/sr.json"
  part sr_switches "${SWITCH_LIMIT:-110}" "$py" scripts/bench/bench_dist.py -c "${SR_CONFIG:-configs/flashtalk-sr720p.yaml}" --seconds 3 "$box"
  part first_frame "${FIRST_LIMIT:-170}" "$py" scripts/gpu/gpu_levers.py --pipeline-only --chunks 3 --json "$out/first_frame.json"
  part levers "${LEVERS_LIMIT:-170}" "$py" scripts/gpu/gpu_levers.py --no-pipeline --sizes 768x448 --repeats 2 \
    --only "${LEVERS:-baseline,cache_kv,flash,efficient,cudnn,cuda_graphs,fp8,compile,best}" --json "$out/levers.json"
  # shellcheck disable=SC2086
  part load "${LOAD_LIMIT:-45}" "$py" scripts/bench/bench_load.py ${LOAD_ARGS:---layers 2} --json "$out/load.json"
  echo "=== short: done after $SECONDS s"
  exit 0
fi
if [ "$only" = firstframe ]; then
  tag=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE '[A-Z][0-9]{2,4}[A-Z]*' | head -1 | tr 'A-Z' 'a-z')
  tag=${tag:-gpu}
  part levers "${LEVERS_LIMIT:-300}" "$py" scripts/gpu/gpu_levers.py --repeats 2 --json "docs/gpu_levers_$tag.json"
  part first_frame "${FIRST_LIMIT:-200}" "$py" scripts/bench/bench_first_frame.py -c configs/flashtalk.yaml --seconds 2 --first 0,4 \
    --json "docs/gpu_first_frame_$tag.json" "$box"
  part load "${LOAD_LIMIT:-80}" "$py" scripts/bench/bench_load.py --layers 4 --json "docs/gpu_load_$tag.json"
  echo "=== firstframe: done after $SECONDS s; figures in docs/gpu_*_$tag.json"
  exit 0
fi
part render "${RENDER_LIMIT:-170}" "$py" -m avatar_render render --ref examples/face.png --audio "$out/clip.wav" \
  -c configs/flashtalk.yaml -o "$out/render.mp4" --report "$out/render.json" --force "$box"
part probe 30 "$py" -c '
import sys, av
with av.open(sys.argv[1]) as c:
    v, a = c.streams.video[0], c.streams.audio[0]
    frames = sum(1 for _ in c.decode(video=0))
    print(f"{v.codec_context.name} {v.width}x{v.height}, {frames} frames decoded; {a.codec_context.name} {a.rate} Hz; {c.duration / 1e6:.3f} s")
' "$out/render.mp4"

# One process per GPU: with several GPUs the stage runs below are torchrun launches over all of them
# (sequence parallel over every GPU, so each process holds 1/N of the DiT and of every chunk's tokens).
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
launch=("$py")
dist=()
if [ "${gpus:-0}" -gt 1 ]; then
  launch=(torchrun --standalone --nproc-per-node "$gpus" --log-dir /dev/null)
  dist=("dist.sp=$gpus")
fi
part switches "${SWITCH_LIMIT:-150}" "${launch[@]}" scripts/bench/bench_dist.py -c configs/flashtalk.yaml --seconds 3 "$box" "${dist[@]}"
part switches_offloaded "${SWITCH_LIMIT:-150}" "${launch[@]}" scripts/bench/bench_dist.py -c configs/flashtalk.yaml --seconds 3 "$box" \
  dist.offload.dit=offloaded "${dist[@]}"
# The 40-step recipe at 480p and 720p, two chunks of NODE_STEPS steps each (the per-step time is printed;
# a 40-step chunk takes about 40 of them).
for size in 480p 720p; do
  part "node_$size" "${NODE_LIMIT:-240}" "${launch[@]}" scripts/bench/bench_dist.py -c "configs/infinitetalk-$size.yaml" --seconds 3 "$box" \
    "model.steps=${NODE_STEPS:-1}" "${dist[@]}"
done

# The SR stage: its speed at full size, an end-to-end render through it, and the stage switches around it.
if [ -z "${SKIP_SR:-}" ]; then
  part sr "${SR_LIMIT:-240}" "$py" scripts/gpu/gpu_check.py --sr --out "$out/sr.json"
  part sr_render "${SR_RENDER_LIMIT:-240}" "$py" -m avatar_render render --ref examples/face.png --audio "$out/clip.wav" \
    -c configs/flashtalk-sr720p.yaml -o "$out/render_sr.mp4" --report "$out/render_sr.json" --force "$box"
  part sr_probe 30 "$py" -c '
import json, sys, av
with av.open(sys.argv[1]) as c:
    v = c.streams.video[0]
    print(f"{v.codec_context.name} {v.width}x{v.height}, {sum(1 for _ in c.decode(video=0))} frames decoded")
r = json.load(open(sys.argv[2]))
print("stage seconds:", {k: round(v, 2) for k, v in r["stage_s"].items()}, "| generated fps", r["generated_fps"], "| peak GPU MiB", r["peak_gpu_mb"])
' "$out/render_sr.mp4" "$out/render_sr.json"
  part sr_switches "${SWITCH_LIMIT:-150}" "${launch[@]}" scripts/bench/bench_dist.py -c configs/flashtalk-sr720p.yaml --seconds 3 "$box" "${dist[@]}"
  part sr_switches_offloaded "${SWITCH_LIMIT:-150}" "${launch[@]}" scripts/bench/bench_dist.py -c configs/flashtalk-sr720p.yaml --seconds 3 "$box" \
    dist.offload.sr=offloaded "${dist[@]}"
fi

# The speed figures (docs/benchmarks.md has them for one H200), then, least sure to fit, compiled blocks.
[ -n "${SKIP_SPEED:-}" ] || part speed "${SPEED_LIMIT:-220}" "$py" scripts/gpu/gpu_check.py --out "$out/speed.json"
[ -n "${SKIP_COMPILE:-}" ] || part speed_compiled "${COMPILE_LIMIT:-300}" "$py" scripts/gpu/gpu_check.py --compile --sizes 640x640 --repeats 1
