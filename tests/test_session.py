"""Sessions: the audio arrives as a stream (standard input, pieces pushed over HTTP), its length open.

Real producers on the loopback: a pipe, ``ffmpeg -re`` paced into standard input, a client pushing
speech in pieces with gaps. The checks are on content, never on speed: a real-time session's output
equals the file render of the audio it reports it played (what came, with the silence it put in
where it says), byte for byte."""

from __future__ import annotations

import http.client
import json
import math
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import av
import numpy as np
import pytest

from avatar_render.api import RenderRequest, render
from avatar_render.config import SessionConfig, load_config
from avatar_render.errors import AvatarRenderError
from tests.live_util import FFMPEG, env, free_port, needs_ffmpeg, render_cmd, wait_listening

RATE = 16000  # the sessions' raw PCM: s16le, 16 kHz, mono (an AAC rate: the output keeps it)
# what a real-time session renders with (the session's defaults)
REALTIME_CHUNKS = (f"chunk.chunk_frames={SessionConfig().chunk_frames}",
                   f"chunk.transition_frames={SessionConfig().transition_frames}")


def _pcm(seconds: float) -> np.ndarray:
    """examples/talk.wav as 16 kHz mono int16."""
    out = subprocess.run([FFMPEG, "-v", "error", "-i", str(Path(__file__).parents[1] / "examples" / "talk.wav"),
                          "-t", str(seconds), "-ar", str(RATE), "-ac", "1", "-f", "s16le", "-"],
                         capture_output=True, check=True).stdout
    return np.frombuffer(out, np.int16)


def _wav(path: Path, pcm: np.ndarray, *, data_size: int | None = None) -> Path:
    data = pcm.astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", 1, 1, RATE, 2 * RATE, 2, 16)
    size = len(data) if data_size is None else data_size
    path.write_bytes(b"RIFF" + struct.pack("<I", 36 + size) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
                     + b"data" + struct.pack("<I", size) + data)
    return path


def _render(*args: str, stdin=None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(render_cmd(*args, "-q"), input=stdin, capture_output=True, env=env(), timeout=300)
    if check:
        assert result.returncode == 0, result.stderr.decode()[-2000:]
    return result


def _played(pcm: np.ndarray, idle: list[list[float]]) -> np.ndarray:
    """The session's audio as it reports it: what came, with its silences put in where it says."""
    out, taken = [], 0
    played = 0  # samples of the session's timeline so far
    for start, length in idle:
        at = round(start * RATE)
        out.append(pcm[taken:taken + at - played])
        taken += at - played
        out.append(np.zeros(round(length * RATE), np.int16))
        played = at + round(length * RATE)
    out.append(pcm[taken:])
    return np.concatenate(out)


def _durations(path: Path) -> tuple[float, float, np.ndarray]:
    """Where the video and the audio end (s, from their packets) and the video frames (T, H, W, 3) of an MP4."""
    ends = {}
    with av.open(str(path)) as c:
        for packet in c.demux():
            if packet.pts is not None:
                end = float((packet.pts + packet.duration) * packet.stream.time_base)
                ends[packet.stream.type] = max(ends.get(packet.stream.type, 0.0), end)
    with av.open(str(path)) as c:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    return ends["video"], ends["audio"], frames


def _moving(frames: np.ndarray) -> bool:
    """Whether the frames change over time (the idle face breathes and sways; it is not a still)."""
    return bool(np.abs(frames[1:].astype(np.int16) - frames[:-1]).max() > 0)


@pytest.mark.slow
@needs_ffmpeg
def test_a_finished_file_piped_in_renders_the_same_bytes_as_the_file(tmp_path):
    """--audio - with a WAV whose header says 0xFFFFFFFF (as ffmpeg writes to a pipe) or a wrong length, or with
    raw PCM (audio.raw), gives the file render's bytes; the report says the duration was open."""
    pcm = _pcm(2.0)
    wav = _wav(tmp_path / "talk.wav", pcm)
    _render("--audio", str(wav), "-o", str(tmp_path / "file.mp4"))
    piped = subprocess.run([FFMPEG, "-v", "error", "-i", str(wav), "-c:a", "pcm_s16le", "-f", "wav", "-"],
                           capture_output=True, check=True).stdout
    at = piped.index(b"data") + 4
    assert piped[at:at + 4] in (b"\xff\xff\xff\xff", b"\0\0\0\0")  # what a pipe's WAV header says
    _render("--audio", "-", "-o", str(tmp_path / "pipe.mp4"), "--report", str(tmp_path / "pipe.json"), stdin=piped)
    wrong = _wav(tmp_path / "wrong.wav", pcm, data_size=4000).read_bytes()
    _render("--audio", "-", "-o", str(tmp_path / "wrong.mp4"), stdin=wrong)
    _render("--audio", "-", "-o", str(tmp_path / "raw.mp4"), "audio.raw=s16le:16000:1", stdin=pcm.tobytes())
    file_bytes = (tmp_path / "file.mp4").read_bytes()
    for name in ("pipe.mp4", "wrong.mp4", "raw.mp4"):
        assert (tmp_path / name).read_bytes() == file_bytes, name
    report = json.loads((tmp_path / "pipe.json").read_text())
    assert report["open_duration"] is True and report["frames"] == 50 and report["idle_s"] is None


@pytest.mark.slow
@needs_ffmpeg
def test_ffmpeg_paced_into_standard_input_runs_on_the_clock(tmp_path):
    """ffmpeg -re feeds 2 s of speech at real-time pace: the output holds it all, in order, plus whatever
    silence the session reports it put in; video and audio end within a frame of each other."""
    pcm = _pcm(2.0)
    wav = _wav(tmp_path / "talk.wav", pcm)
    producer = subprocess.Popen([FFMPEG, "-v", "error", "-re", "-i", str(wav), "-c:a", "pcm_s16le",
                                 "-flush_packets", "1", "-f", "wav", "-"], stdout=subprocess.PIPE)
    session = subprocess.run(render_cmd("--audio", "-", "-o", str(tmp_path / "s.mp4"), "--report",
                                        str(tmp_path / "s.json"), "-q", "session.realtime=on"),
                             stdin=producer.stdout, capture_output=True, env=env(), timeout=300)
    producer.wait(timeout=60)
    assert session.returncode == 0, session.stderr.decode()[-2000:]
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["open_duration"] is True
    played = _played(pcm, report["idle"])
    assert abs(report["duration_s"] - len(played) / RATE) < 1e-3
    _render("--audio", str(_wav(tmp_path / "played.wav", played)), "-o", str(tmp_path / "file.mp4"), *REALTIME_CHUNKS)
    assert (tmp_path / "s.mp4").read_bytes() == (tmp_path / "file.mp4").read_bytes()
    video_s, audio_s, _ = _durations(tmp_path / "s.mp4")
    assert abs(video_s - audio_s) <= 1 / 25


def _post(port: int, path: str, pieces: list[bytes] = (), *, pause_s: float = 0.0) -> int:
    """POST ``pieces`` as one chunked body (``pause_s`` between them), once the server listens."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.putrequest("POST", path)
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    for piece in pieces:
        connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        time.sleep(pause_s)
    connection.send(b"0\r\n\r\n")
    response = connection.getresponse()
    response.read()
    connection.close()
    return response.status


@pytest.mark.slow
@needs_ffmpeg
def test_speech_pushed_in_pieces_with_gaps_shows_an_idle_face_between_them(tmp_path):
    """An agent's synthesizer pushes two utterances with a 2.5 s gap, then POST /end: every sample that came is
    in the output once, in order, with the session's silence (idle, moving frames) in the gap."""
    pcm = _pcm(2.0)
    port = free_port()
    session = subprocess.Popen(
        render_cmd("--audio", "post:", "--serve", f"127.0.0.1:{port}", "--serve-linger", "0", "video.gop_seconds=10",
                   "-o", str(tmp_path / "s.mp4"), "--report", str(tmp_path / "s.json"), "-q",
                   "audio.raw=s16le:16000:1"),
        stderr=subprocess.PIPE, env=env())
    try:
        wait_listening(port, timeout=60)
        first, second = pcm[:RATE].tobytes(), pcm[RATE:].tobytes()
        assert _post(port, "/audio", [first[i:i + 3200] for i in range(0, len(first), 3200)], pause_s=0.1) == 204
        time.sleep(2.5)
        assert _post(port, "/audio", [second]) == 204
        assert _post(port, "/end") == 204
        assert session.wait(timeout=120) == 0, session.stderr.read().decode()[-2000:]
    finally:
        session.kill()
    report = json.loads((tmp_path / "s.json").read_text())
    gaps = [(start, length) for start, length in report["idle"] if 0.5 <= start <= 1.5]
    assert gaps and gaps[0][1] >= 1.0, report["idle"]  # the gap after the first utterance was filled
    played = _played(pcm, report["idle"])
    _render("--audio", str(_wav(tmp_path / "played.wav", played)), "-o", str(tmp_path / "file.mp4"), *REALTIME_CHUNKS)
    assert (tmp_path / "s.mp4").read_bytes() == (tmp_path / "file.mp4").read_bytes()
    video_s, audio_s, frames = _durations(tmp_path / "s.mp4")
    assert abs(video_s - audio_s) <= 1 / 25
    start, length = gaps[0]
    assert _moving(frames[round(start * 25) + 3:round((start + length) * 25) - 3])


def _session_on_a_pipe(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A session reading 6 s of raw PCM from a pipe this test holds open; returned once its partial file
    plays a second of video."""
    session = subprocess.Popen(render_cmd("--audio", "-", "-o", str(tmp_path / "s.mp4"), "-q",
                                          "audio.raw=s16le:16000:1", "video.gop_seconds=1"),
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    session.stdin.write(_pcm(6.0).tobytes())
    session.stdin.flush()
    partial = tmp_path / "s.partial.mp4"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _playable_frames(partial) < 25:
        time.sleep(0.2)
    return session, partial


def _playable_frames(path: Path) -> int:
    try:
        with av.open(str(path)) as c:
            return sum(1 for _ in c.decode(video=0))
    except (av.FFmpegError, OSError):
        return 0


@pytest.mark.slow
@needs_ffmpeg
def test_ctrl_c_finishes_a_session_with_the_audio_that_came(tmp_path):
    session, _ = _session_on_a_pipe(tmp_path)
    session.send_signal(signal.SIGINT)
    assert session.wait(timeout=120) == 0, session.stderr.read().decode()[-2000:]
    session.stdin.close()
    video_s, audio_s, _ = _durations(tmp_path / "s.mp4")
    assert abs(audio_s - 6.0) < 0.01 and abs(video_s - audio_s) <= 1 / 25
    assert not (tmp_path / "s.partial.mp4").exists()


@pytest.mark.slow
@needs_ffmpeg
def test_a_killed_session_leaves_a_playable_file_that_only_force_replaces(tmp_path):
    session, partial = _session_on_a_pipe(tmp_path)
    session.kill()
    session.wait(timeout=60)
    video_s, audio_s, _ = _durations(partial)
    assert video_s >= 1.0 and _playable_frames(partial) == round(video_s * 25)
    # (the AAC encoder holds its last frames until it is flushed: a kill loses up to two, 128 ms at 16 kHz)
    assert 0 <= video_s - audio_s <= 2 * 1024 / RATE + 1 / 25
    again = _render("--audio", "-", "-o", str(tmp_path / "s.mp4"), "audio.raw=s16le:16000:1", stdin=b"\0" * 3200,
                    check=False)
    assert again.returncode == 1
    assert "a session cannot continue it (its audio is a stream): pass --force" in again.stderr.decode()
    assert partial.exists()


def test_a_session_cannot_be_resumed_nor_pushed_to_without_serve(tmp_path, face_png):
    cfg = load_config()
    with pytest.raises(AvatarRenderError, match="cannot be resumed: its audio cannot be read again"):
        render(RenderRequest(reference=face_png, audio="-", output=tmp_path / "o.mp4", config=cfg, resume=True))
    with pytest.raises(AvatarRenderError, match="add --serve PORT"):
        render(RenderRequest(reference=face_png, audio="post:", output=tmp_path / "o.mp4", config=cfg))
    bad = load_config(overrides=("audio.raw=s16le:16000",))
    with pytest.raises(AvatarRenderError, match="is not a raw PCM format"):
        render(RenderRequest(reference=face_png, audio="-", output=tmp_path / "o.mp4", config=bad))
    assert not list(tmp_path.iterdir())
    text = _render("--audio", "-", "-o", str(tmp_path / "o.mp4"), stdin=b"hello, not audio\n", check=False)
    assert text.returncode == 1 and text.stderr.decode().strip() == (
        "Error: The audio from standard input is not an audio stream that can be read; give WAV, fragmented MP4, "
        "Ogg, MPEG-TS or raw PCM with audio.raw=FORMAT:RATE:CHANNELS.")
    assert not list(tmp_path.iterdir())
    empty = _render("--audio", "-", "-o", str(tmp_path / "o.mp4"), stdin=b"", check=False)
    assert empty.returncode == 1 and empty.stderr.decode().strip() == (
        "Error: The audio from standard input ended before its first byte: no audio came.")
    assert not list(tmp_path.iterdir())
    from tests.media import speech_like, write_audio

    m4a = write_audio(tmp_path / "clip.m4a", speech_like(4.0, 44100), 44100)  # (its index written at its end)
    indexed = _render("--audio", "-", "-o", str(tmp_path / "o.mp4"), stdin=m4a.read_bytes(), check=False)
    assert indexed.returncode == 1 and "has its index after its sound" in indexed.stderr.decode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.m4a"]


def test_a_real_time_session_pushes_with_a_shorter_pre_roll_unless_told(face_png):
    from avatar_render.api import LiveOptions
    from avatar_render.job.live import PREROLL_S, Live
    from avatar_render.job.session import SESSION_PREROLL_S, session_request

    def preroll(audio: str, **options) -> float:
        live = LiveOptions(targets=("rtmp://127.0.0.1:1/live/k",), **options)
        request = session_request(RenderRequest(reference=face_png, audio=audio, output=None, config=load_config(),
                                                live=live))
        return Live(request, on_message=lambda level, text: None).preroll_s

    assert SESSION_PREROLL_S < PREROLL_S
    assert preroll("rtmp://127.0.0.1:9/live/in") == SESSION_PREROLL_S  # a listener: on the clock
    assert preroll("-") == PREROLL_S  # a pipe is file-like unless session.realtime=on
    assert preroll("tests/x.wav") == PREROLL_S  # a file
    assert preroll("rtmp://127.0.0.1:9/live/in", preroll_s=1.5) == 1.5  # --preroll wins


@pytest.mark.slow
@needs_ffmpeg
def test_an_rtmp_sender_into_the_listener_is_a_real_time_session(tmp_path):
    """ffmpeg -re publishes 2 s of speech (AAC in FLV) to --audio rtmp://127.0.0.1:PORT/...: the session (real
    time by default) ends with the publisher and holds its audio; video and audio end within a frame."""
    wav = _wav(tmp_path / "talk.wav", _pcm(2.0))
    port = free_port()
    session = subprocess.Popen(render_cmd("--audio", f"rtmp://127.0.0.1:{port}/live/key", "-o", str(tmp_path / "s.mp4"),
                                          "--report", str(tmp_path / "s.json"), "-q"),
                               stderr=subprocess.PIPE, env=env())
    try:
        wait_listening(port, timeout=60)
        subprocess.run([FFMPEG, "-v", "error", "-re", "-i", str(wav), "-c:a", "aac", "-f", "flv",
                        f"rtmp://127.0.0.1:{port}/live/key"], check=True, timeout=60)
        assert session.wait(timeout=120) == 0, session.stderr.read().decode()[-2000:]
    finally:
        session.kill()
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["open_duration"] is True and report["idle_s"] is not None
    # what came is the sender's AAC decoded: 2 s plus its priming and padding (under three 1024-sample frames)
    assert 2.0 <= report["duration_s"] - report["idle_s"] <= 2.0 + 3 * 1024 / RATE
    video_s, audio_s, _ = _durations(tmp_path / "s.mp4")
    assert abs(video_s - audio_s) <= 1 / 25


@pytest.mark.slow
@needs_ffmpeg
def test_an_srt_sender_into_the_listener_is_a_real_time_session(tmp_path):
    """The same through an SRT listener (the ffmpeg command reads it): the idle face while nobody has connected
    yet is in the report's silence, the sender's 2 s of speech after it."""
    wav = _wav(tmp_path / "talk.wav", _pcm(2.0))
    port = free_port(socket.SOCK_DGRAM)
    session = subprocess.Popen(render_cmd("--audio", f"srt://127.0.0.1:{port}?mode=listener", "-o",
                                          str(tmp_path / "s.mp4"), "--report", str(tmp_path / "s.json"), "-q"),
                               stderr=subprocess.PIPE, env=env())
    try:
        wait_listening(port, udp=True, timeout=60)
        subprocess.run([FFMPEG, "-v", "error", "-re", "-i", str(wav), "-c:a", "aac", "-f", "mpegts",
                        f"srt://127.0.0.1:{port}?linger=10"], check=True, timeout=60)
        assert session.wait(timeout=120) == 0, session.stderr.read().decode()[-2000:]
    finally:
        session.kill()
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["open_duration"] is True and report["idle"] and report["idle"][0][0] == 0.0
    assert 2.0 <= report["duration_s"] - report["idle_s"] <= 2.0 + 3 * 1024 / RATE
    video_s, audio_s, _ = _durations(tmp_path / "s.mp4")
    assert abs(video_s - audio_s) <= 1 / 25


@pytest.mark.slow
@needs_ffmpeg
def test_a_real_time_session_on_the_tiny_diffusion_config(tmp_path):
    """The diffusion backend (tiny config) in a session fed by ffmpeg -re: it keeps its own chunk sizes, holds
    every sample that came plus the silence it reports, and its video and audio end within a frame."""
    pcm = _pcm(1.0)
    wav = _wav(tmp_path / "talk.wav", pcm)
    producer = subprocess.Popen([FFMPEG, "-v", "error", "-re", "-i", str(wav), "-c:a", "pcm_s16le",
                                 "-flush_packets", "1", "-f", "wav", "-"], stdout=subprocess.PIPE)
    session = subprocess.run(render_cmd("-c", str(Path(__file__).parents[1] / "configs" / "tiny.yaml"), "--audio", "-",
                                        "-o", str(tmp_path / "s.mp4"), "--report", str(tmp_path / "s.json"), "-q",
                                        "session.realtime=on"),
                             stdin=producer.stdout, capture_output=True, env=env(), timeout=300)
    producer.wait(timeout=60)
    assert session.returncode == 0, session.stderr.decode()[-2000:]
    report = json.loads((tmp_path / "s.json").read_text())
    assert abs(report["duration_s"] - (1.0 + report["idle_s"])) < 1e-3
    assert report["frames"] == math.ceil(report["duration_s"] * 25 - 1e-9)
    video_s, audio_s, _ = _durations(tmp_path / "s.mp4")
    assert abs(video_s - audio_s) <= 1 / 25

