"""The final copy of a render's fragmented MP4 into a regular one (index in front): peak memory and
time against the duration, ours (``io.faststart``) beside FFmpeg's stream copy (the code before it).

For each duration a fragmented file in the writer's own form is made from one real second (25 frames
at 64x48 of noise, 48 kHz stereo AAC) written again and again, each copy a fragment; then each copy
method runs on it in a fresh process, and the two results are compared packet for packet
(``ffmpeg -c copy -f framemd5``).

    python scripts/bench/faststart_memory.py --seconds 60,3600,36000 --dir /tmp/fs

The ten-hour file takes 2.5 GB of disk, and each of its copies as much again; every file is removed
at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np

from avatar_render.io.encoder import ChunkEncoder
from avatar_render.io.fmp4 import Fmp4Muxer, Sample
from avatar_render.io.writer import WriterSpec

COPY = """
import sys, time, av
from pathlib import Path
from avatar_render.io.faststart import remux_faststart  # (both with the same modules loaded)
src, dst, how = sys.argv[1:4]
start = time.perf_counter()
if how == "ours":
    remux_faststart(Path(src), Path(dst))
else:
    with av.open(src) as source, av.open(dst, "w", format="mp4", options={"movflags": "faststart"}) as out:
        streams = {s.index: out.add_stream_from_template(s) for s in source.streams}
        for packet in source.demux():
            if packet.dts is not None:
                packet.stream = streams[packet.stream.index]
                out.mux(packet)
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))  # this process's own peak
print(time.perf_counter() - start, int(peak.split()[1]) / 1024)
"""


def one_second() -> tuple[ChunkEncoder, list[Sample], list[Sample]]:
    """The encoder (for its tracks) and one second's samples from the middle of a stream."""
    spec = WriterSpec(path=None, width=64, height=48, fps=Fraction(25), audio_rate=48000, audio_channels=2)
    encoder = ChunkEncoder(spec)
    rng = np.random.default_rng(0)
    for _ in range(3):  # the third second: its audio fills whole AAC frames
        fragment = encoder.encode(rng.integers(0, 256, (25, 48, 64, 3), dtype=np.uint8),
                                  (0.1 * rng.standard_normal((2, 48000))).astype(np.float32), opens_gop=True)
    audio = [Sample(s.data, 1024, s.key) for s in fragment.audio]
    return encoder, fragment.video, audio


def write_fragmented(path: Path, seconds: int) -> None:
    encoder, video, audio = one_second()
    with open(path, "xb", buffering=0) as file:
        muxer = Fmp4Muxer(file, encoder.tracks)
        muxer.write_init()
        for _ in range(seconds):
            muxer.write_fragment(video, audio)


def packets_digest(path: Path) -> str:
    """A digest of every packet's stream, times, size and data, as FFmpeg reads them."""
    digest = hashlib.md5()
    with subprocess.Popen(["ffmpeg", "-v", "error", "-i", str(path), "-map", "0", "-c", "copy", "-f", "framemd5", "-"],
                          stdout=subprocess.PIPE) as ffmpeg:
        for block in iter(lambda: ffmpeg.stdout.read(1 << 20), b""):
            digest.update(block)
    if ffmpeg.returncode:
        raise SystemExit(f"ffmpeg could not read {path}")
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", default="60,3600,36000", help="comma-separated durations")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (a new temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        print("duration | fragmented file | ours: s, peak MB | FFmpeg's copy: s, peak MB | same packets")
        for seconds in (int(s) for s in args.seconds.split(",")):
            src = Path(folder) / f"fragmented_{seconds}.mp4"
            write_fragmented(src, seconds)
            figures, digests = [], []
            for how in ("ours", "ffmpeg"):
                dst = Path(folder) / f"{how}_{seconds}.mp4"
                out = subprocess.run([sys.executable, "-c", COPY, str(src), str(dst), how], capture_output=True,
                                     text=True, check=True).stdout.split()
                figures.append(f"{float(out[0]):.1f} s, {float(out[1]):.1f} MB")
                digests.append(packets_digest(dst))
                dst.unlink()
            print(f"{seconds} s | {src.stat().st_size / 1e6:.0f} MB | {figures[0]} | {figures[1]} | "
                  f"{'yes' if digests[0] == digests[1] else 'NO'}", flush=True)
            src.unlink()


if __name__ == "__main__":
    main()
