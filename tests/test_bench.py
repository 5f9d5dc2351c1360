"""``bench``: the matrix, the rows made from render reports, and a tiny run that writes JSON and PNGs."""

import json
import subprocess
import sys
import wave

import pytest

from avatar_render.bench import BenchCase, bench_matrix, loop_speech, parse_matrix, summarize
from avatar_render.errors import AvatarRenderError
from tests.media import speech_like, write_audio

PNG = b"\x89PNG\r\n\x1a\n"


def test_matrix_covers_every_combination_short_first():
    cases = bench_matrix([60, 10], [(96, 96), (128, 64)], ["preview", "tiny"])
    assert len(cases) == 8 and len(set(cases)) == 8
    assert [c.seconds for c in cases[:2]] == [10, 60]
    assert {c.backend for c in cases} == {"preview", "tiny"}
    assert parse_matrix("1, 2", "96x96", "preview") == [BenchCase(1, 96, 96), BenchCase(2, 96, 96)]
    for bad in (("x", "96x96", "preview"), ("1", "96", "preview"), ("0", "96x96", "preview"), ("1", "96x96", " ")):
        with pytest.raises(AvatarRenderError):
            parse_matrix(*bad)


def test_summarize_turns_chunk_records_into_series():
    report = {"duration_s": 4.0, "frames": 100, "fps": 25.0, "width": 96, "height": 96, "chunks": 2, "inputs_s": 0.5,
              "time_to_first_frame_s": 0.2, "first_frame_on_disk_s": 0.3, "wall_s": 2.5, "generated_fps": 50.0,
              "realtime_factor": 1.6, "peak_rss_mb": 200.0, "stage_s": {"decode": 1.0}}
    report["chunks"] = [{"kind": "N", "index": 0, "start": 0, "end": 50, "t_s": 1.5, "rss_mb": 150.0},
                        {"kind": "N", "index": 1, "start": 50, "end": 100, "t_s": 2.0, "rss_mb": 160.0}]
    row = summarize(report, backend="preview")
    assert row["series"]["fps"] == [50.0, 100.0]  # 50 frames in 1.0 s after the inputs, then in 0.5 s
    assert row["series"]["end_frame"] == [50, 100] and row["series"]["rss_mb"] == [150.0, 160.0]
    assert (row["rss_mb_first_chunk"], row["rss_mb_last_chunk"], row["backend"]) == (150.0, 160.0, "preview")
    assert row["chunks"] == 2
    assert row["peak_gpu_mb"] is None  # a CPU report; a GPU one carries its figure through
    assert summarize({**report, "peak_gpu_mb": 3000.0}, backend="infinitetalk")["peak_gpu_mb"] == 3000.0


def test_loop_speech_is_exactly_as_long_as_asked(tmp_path):
    src = write_audio(tmp_path / "s.wav", speech_like(0.7, 16000), 16000)
    out = loop_speech(src, 2.25, tmp_path / "long.wav")
    with wave.open(str(out)) as w:
        assert w.getnframes() == 36000 and w.getframerate() == 16000


@pytest.mark.slow
def test_bench_cli_writes_table_json_and_plots(tmp_path, face_png):
    speech = write_audio(tmp_path / "talk.wav", speech_like(1.0, 16000), 16000)
    out_dir = tmp_path / "results"
    done = subprocess.run([sys.executable, "-m", "avatar_render", "bench", "--durations", "1,2", "--sizes", "96x96",
                           "--ref", str(face_png), "--speech", str(speech), "--out", str(out_dir),
                           "chunk.chunk_frames=10",
                               "chunk.transition_frames=4"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "1 s at 96x96 (preview)" in done.stdout and "2 s at 96x96 (preview)" in done.stdout
    # the table's caption, the files
    assert "generated frames per second" in done.stdout and "bench.json" in done.stdout
    # piped (80 columns): every header and figure whole, none cut to 'bac...'
    assert "…" not in done.stdout and "..." not in done.stdout and "MB chunk 1/last" in done.stdout
    record = json.loads((out_dir / "bench.json").read_text())
    assert record["written_by"] == "avatar-render bench"
    rows = record["rows"]
    assert [(r["duration_s"], r["frames"], r["backend"]) for r in rows] == [(1.0, 25, "preview"), (2.0, 50, "preview")]
    for r in rows:
        assert len(r["series"]["t_s"]) == len(r["series"]["rss_mb"]) == len(r["series"]["fps"]) == r["chunks"]
        assert r["series"]["end_frame"][-1] == r["frames"] and min(r["series"]["fps"]) > 0
        assert r["encode_realtime_factor"] > 0 and r["encode_ratio"] > 0  # the encoder alone on the same frames
    assert "the encoder alone" in done.stdout and "encode x" in done.stdout
    for name in ("bench_memory.png", "bench_fps.png", "bench_stages.png"):
        assert (out_dir / name).read_bytes()[:8] == PNG, name
    assert len(list((out_dir / "reports").glob("*.json"))) == 2


def test_bench_cli_reports_an_unknown_backend(tmp_path, face_png):
    speech = write_audio(tmp_path / "talk.wav", speech_like(1.0, 16000), 16000)
    done = subprocess.run([sys.executable, "-m", "avatar_render", "bench", "--durations", "1", "--sizes", "96x96",
                           "--backends", "nosuch",
                           "--ref", str(face_png), "--speech", str(speech), "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "nosuch" in done.stderr and done.stderr.strip().startswith("Error:")


@pytest.mark.parametrize("extra, said", [
    (["--durations", "1", "2"], "'2' is not a key=value override; --durations, --sizes and --backends take "
                                "comma-separated lists (--durations 10,60,600)."),
    (["--durations", "1", "nosuch.key=3"], "Unknown config key 'nosuch'."),
    # (a size a render refuses is refused by bench too, before it makes anything)
    (["--durations", "1", "--sizes", "17x17"], "--sizes takes sizes like 512x512, each side an even number from 16"),
    # (the folder bench made is gone again when the speech, or its first render, fails)
    (["--durations", "1", "--speech", "{face}"], "must be a non-empty 16-bit PCM WAV"),
    (["--durations", "1", "--backends", "nope"], "benchmark render failed: Config key 'backend' must be one of"),
])
def test_bench_cli_refuses_stray_arguments_and_bad_overrides_before_rendering(tmp_path, face_png, extra, said):
    speech = write_audio(tmp_path / "talk.wav", speech_like(1.0, 16000), 16000)
    done = subprocess.run([sys.executable, "-m", "avatar_render", "bench", "--sizes", "96x96", "--ref", str(face_png),
                           "--speech", str(speech), "--out", str(tmp_path / "r"),
                           *(e.replace("{face}", str(face_png)) for e in extra)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr and said in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()  # before anything ran


@pytest.mark.slow
def test_telemetry_cost_counts_calls_and_prices_them(tmp_path, face_png):
    from avatar_render.metrics.telemetry_cost import measure

    speech = write_audio(tmp_path / "talk.wav", speech_like(1.0, 16000), 16000)
    cost = measure(face_png, speech, repeats=1, overrides=("video.width=96", "video.height=96", "chunk.chunk_frames=10",
                                                            "chunk.transition_frames=0"))
    assert cost.frames == 25 and cost.chunk_records == 3
    assert cost.stage_calls >= 4 * cost.chunk_records  # audio, context, a2v, decode, write per chunk
    assert cost.stage_call_us > 0 and cost.chunk_record_us > 0  # (what they are is the benchmark's to print)
    assert cost.render_s_with > 0 and cost.render_s_without > 0 and 0 < cost.bottom_up_pct < 100


def test_encode_only_gives_a_videos_frames_to_the_renders_encoder_chunk_by_chunk(tmp_path, monkeypatch):
    """``bench``'s encoder-alone rate: every frame of the file, in chunks of the render's size, a GOP opened
    at the first chunk start ``gop_seconds`` after the last, only the encoder's calls timed."""
    from avatar_render.io import encode_rate as module
    from tests.media import write_video_without_audio

    video = write_video_without_audio(tmp_path / "v.mp4", 2.2)  # 22 frames at 10 fps
    calls = []
    real = module.ChunkEncoder.encode

    def encode(self, frames, audio, *, opens_gop, **kw):
        calls.append((len(frames), opens_gop))
        return real(self, frames, audio, opens_gop=opens_gop, **kw)

    monkeypatch.setattr(module.ChunkEncoder, "encode", encode)
    rate = module.encode_rate(video, crf=20, preset="veryfast", gop_seconds=1.0, chunk_frames=4)
    assert rate.frames == 22 and float(rate.fps) == 10.0
    assert calls == [(4, True), (4, False), (4, False), (4, True), (4, False), (2, False)]  # GOPs of 10 frames or more
    assert rate.seconds > 0 and rate.realtime_factor == pytest.approx(22 / rate.seconds / 10)


def test_a_bench_row_sets_the_render_beside_its_encoder_alone():
    report = {"duration_s": 4.0, "frames": 100, "fps": 25.0, "width": 96, "height": 96, "inputs_s": 0.5,
              "time_to_first_frame_s": 0.2, "first_frame_on_disk_s": 0.3, "wall_s": 2.5, "generated_fps": 50.0,
              "realtime_factor": 1.6, "peak_rss_mb": 200.0, "stage_s": {}, "chunks": [],
              "encode_only": {"frames": 100, "seconds": 0.5, "fps": 200.0, "realtime_factor": 8.0}}
    row = summarize(report, backend="preview")
    assert (row["encode_realtime_factor"], row["encode_ratio"]) == (8.0, 0.2)
    del report["encode_only"]
    assert (summarize(report, backend="preview")["encode_ratio"]) is None
