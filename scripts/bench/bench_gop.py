"""What closed GOPs cost: the same frames and audio encoded with several ``video.gop_seconds``.

Each GOP is encoded by fresh encoders (so that a resumed render writes the uninterrupted bytes). This
re-encodes the frames and audio of a video (e.g. a render of examples/talk.wav) through the writer,
chunk by chunk with a resume point after every chunk, and prints the file size and the CPU seconds
of the encode (all threads, decoding the source subtracted):

    python scripts/bench/bench_gop.py out.mp4 --gops 1,2,4,10 --chunk 50 --crf 20
"""

from __future__ import annotations

import argparse
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from avatar_render.io.spec import WriterSpec  # noqa: E402
from avatar_render.io.writer import Mp4Writer  # noqa: E402


def chunks(video: Path, size: int):
    """(frames (T, H, W, 3) uint8, audio (C, n) float32) of ``size`` frames each, and the formats."""
    with av.open(str(video)) as c:
        fps = c.streams.video[0].average_rate
        audio = np.concatenate([f.to_ndarray() for f in c.decode(audio=0)], axis=1).astype(np.float32)
    rate = int(av.open(str(video)).streams.audio[0].rate)
    per_frame = rate / fps
    with av.open(str(video)) as c:
        batch, start = [], 0
        for frame in c.decode(video=0):
            batch.append(frame.to_ndarray(format="rgb24"))
            if len(batch) == size:
                end = start + len(batch)
                yield np.stack(batch), audio[:, round(start * per_frame) : round(end * per_frame)], fps, rate
                batch, start = [], end
        if batch:
            yield np.stack(batch), audio[:, round(start * per_frame) :], fps, rate


def encode(video: Path, out: Path, *, chunk: int, gop: float | None, crf: int) -> float:
    """CPU seconds of decoding ``video`` (and, with ``gop``, encoding it to ``out``)."""
    t = time.process_time()
    writer = None
    for frames, audio, fps, rate in chunks(video, chunk):
        if gop is None:
            continue
        if writer is None:
            writer = Mp4Writer(WriterSpec(path=out, width=frames.shape[2], height=frames.shape[1], fps=Fraction(fps),
                                          crf=crf, audio_rate=rate, audio_channels=audio.shape[0], gop_seconds=gop))
        writer.put(frames, audio)
        writer.boundary()
    if writer is not None:
        writer.close(faststart=False)
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("video", type=Path)
    ap.add_argument("--gops", default="1,2,4,10", help="comma-separated video.gop_seconds values")
    ap.add_argument("--chunk", type=int, default=50, help="frames per chunk (the preview's default)")
    ap.add_argument("--crf", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    gops = [float(g) for g in a.gops.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        decode = min(encode(a.video, Path(tmp) / "x.mp4", chunk=a.chunk, gop=None, crf=a.crf) for _ in range(a.repeats))
        rows = []
        for gop in gops:
            out = Path(tmp) / f"gop{gop}.mp4"
            cpu = min(encode(a.video, out, chunk=a.chunk, gop=gop, crf=a.crf) for _ in range(a.repeats)) - decode
            rows.append((gop, out.stat().st_size, cpu))
    base_size, base_cpu = rows[-1][1], rows[-1][2]
    print(
        f"{'gop s':>6} {'bytes':>10} {'size':>7} {'encode CPU s':>13} {'CPU':>7}   (relative to gop {rows[-1][0]:g} s)")
    for gop, size, cpu in rows:
        print(f"{gop:>6g} {size:>10} {100 * (size / base_size - 1):>+6.1f}% {cpu:>13.2f} "
              f"{100 * (cpu / base_cpu - 1):>+6.1f}%")


if __name__ == "__main__":
    main()
