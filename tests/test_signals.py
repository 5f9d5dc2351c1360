"""Clean stops: Ctrl-C / SIGTERM finish the chunk, keep a readable partial file and its journal, print
how to resume and exit 130 / 143; a second Ctrl-C stops at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from avatar_render.files.render_paths import render_paths
from avatar_render.job.stop import RenderStopped, StopNow, StopSignals
from tests.media import speech_like, write_wav
from tests.test_resume import (  # noqa: F401
    api_render,
    assert_same_as_reference,
    cli,
    decode,
    driver,
    env,
    render_args,
    work,
)

DELAY = 0.02  # seconds per decode call, so that the signal lands while the render runs


def committed_frames(d, name: str) -> int:
    return json.loads((render_paths(d / name).journal / "journal.json").read_text())["commit"]["frames"]


def plan_end(hashes_report, call: int) -> int:
    """Frames published once the chunk-plan entry that runs decode call ``call`` (1-based) is done."""
    chunks = json.loads(hashes_report.read_text())["chunks"]
    plan = (chunks[call - 1]["kind"], chunks[call - 1]["index"])
    return max(c["end"] for c in chunks if (c["kind"], c["index"]) == plan)


def stderr_lines(done) -> list[str]:
    assert "Traceback" not in done.stderr + done.stdout
    return [line for line in done.stderr.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_first_signal_finishes_the_chunk_and_keeps_a_resumable_file(work, face_png, sig, code):
    d, audio, _, _ = work
    name = f"sig{int(sig)}"
    done = driver([6], sig, *render_args(face_png, audio, f"{name}.mp4"), cwd=d, delay=DELAY)
    assert done.returncode == code
    frames = plan_end(d / "ref.json", 6)
    partial = render_paths(d / f"{name}.mp4").partial
    first = {signal.SIGINT: "stopping at the next keyframe; press Ctrl-C again to stop at once.",
             signal.SIGTERM: "SIGTERM received: stopping at the next keyframe; a second SIGTERM (or Ctrl-C) stops at "
                             "once."}[sig]
    assert stderr_lines(done) == [
        f"Warning: {first}",
        f"Warning: Stopped at a keyframe: '{partial.name}' holds the first {frames} frames ({frames / 25:.1f} s); "
        "run the same command with --resume to continue.",
    ]
    assert committed_frames(d, f"{name}.mp4") == frames
    assert decode(partial)[0] == frames  # a valid file: every frame rendered so far, nothing cut
    if sig == signal.SIGTERM:
        return  # resuming after a stop is the same as after SIGINT
    resumed = cli(*render_args(face_png, audio, f"{name}.mp4", "--resume", "--report", f"{name}.json"), cwd=d)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_as_reference(d, name, work)


@pytest.mark.slow
def test_second_ctrl_c_stops_at_once(work, face_png):
    d, audio, _, _ = work
    done = driver([6, 6], signal.SIGINT, *render_args(face_png, audio, "twice.mp4"), cwd=d, delay=DELAY)
    assert done.returncode == 130
    lines = stderr_lines(done)
    frames = committed_frames(d, "twice.mp4")
    assert lines[-1] == ("Warning: Stopped at once: 'twice.partial.mp4' plays up to its last complete chunk; run the "
                         f"same command with --resume to continue from frame {frames} ({frames / 25:.1f} s).")
    in_file = decode(render_paths(d / "twice.mp4").partial)[0]  # readable to its last whole fragment
    assert frames <= in_file < plan_end(d / "ref.json", 6)
    resumed = cli(*render_args(face_png, audio, "twice.mp4", "--resume", "--report", "twice.json"), cwd=d)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_as_reference(d, "twice", work)


def test_stop_signals_in_process():
    before = signal.getsignal(signal.SIGTERM)
    seen = []
    with StopSignals(on_first=seen.append) as stop:
        assert not stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop() and seen == [signal.SIGTERM] and stop.exit_code == 143
        with pytest.raises(StopNow):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_stop_handler_only_records_and_the_first_poll_tells():
    """The handler runs wherever the main thread was, inside an import too: it records, and the first ``stop()``
    (the render's poll) says so, once."""
    seen = []
    with StopSignals(on_first=seen.append) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGINT and seen == []
        assert stop() and stop() and seen == [signal.SIGINT]


def test_a_signal_the_process_was_started_ignoring_stays_ignored():
    """A script's background job starts with SIGINT ignored: the render does not take it over (it was ignored until
    the render began, and is so throughout)."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert not stop()
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # (SIGTERM is still the render's)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


STARTING = ("Error: Interrupted.",  # (in the imports or while the arguments are read)
            "Warning: stopping at the next keyframe; press Ctrl-C again to stop at once.")  # (the render's handler)


@pytest.mark.parametrize("after_s", [0.05, 0.12, 0.2, 0.3, 0.5])
def test_a_ctrl_c_while_the_command_starts_stops_it_cleanly(face_png, tmp_path, after_s):
    """Wherever the command is when the Ctrl-C comes (importing, reading its arguments, starting the set-up's threads,
    in the render): one line or the stop's two, 130, no traceback, and no process left waiting on a lock (an
    exception raised inside an import while the set-up's threads imported left them waiting for good)."""
    audio = write_wav(tmp_path / "a.wav", speech_like(300.0, 16000), 16000)  # (minutes of work: never done first)
    proc = subprocess.Popen([sys.executable, "-m", "avatar_render", *render_args(face_png, audio, "o.mp4")],
                            cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(after_s)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()  # (one stuck is not left behind)
    # 130, or ended by SIGINT itself, which a shell reports as 130 too: before the interpreter has taken SIGINT over
    # (saying nothing), and now and then after the line was said (seen once in a full run on a loaded machine)
    assert proc.returncode in (130, -signal.SIGINT) and "Traceback" not in out + err, (proc.returncode, err)
    if proc.returncode == -signal.SIGINT and not out + err:
        return
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[:1] == [STARTING[0]] or lines[:1] == [STARTING[1]] and lines[1].startswith("Warning: Stopped"), err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "a.wav") in ([], ["o.mp4.journal", "o.partial.mp4"])


def test_stop_before_the_first_chunk_leaves_nothing(work, face_png, tmp_path):
    _, audio, _, _ = work
    with pytest.raises(RenderStopped, match="before the first chunk was written; nothing to resume") as stopped:
        api_render(tmp_path, face_png, audio, "s.mp4", should_stop=lambda: True)
    assert stopped.value.frames == 0 and list(tmp_path.iterdir()) == []


def test_a_stop_after_the_last_keyframe_is_said_and_the_video_finished(tmp_path, face_png, monkeypatch):
    """A Ctrl-C after the last point a render can stop at (its last plan is done): the video is finished, and
    the command says why it did not stop (it said nothing, and ended 0 as if no signal had come)."""
    from typer.testing import CliRunner

    from avatar_render.cli import app
    from avatar_render.job import loop

    write_wav(tmp_path / "a.wav", speech_like(2.0, 16000), 16000)
    finish = loop.ChunkLoop._finish

    def interrupted(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return finish(self, *args, **kwargs)

    monkeypatch.setattr(loop.ChunkLoop, "_finish", interrupted)
    result = CliRunner().invoke(app, ["render", "--ref", str(face_png), "--audio", str(tmp_path / "a.wav"), "-o",
                                      str(tmp_path / "o.mp4"), "video.width=64", "video.height=64"])
    assert result.exit_code == 0, result.stderr
    assert "SIGINT came during the render's last part: it was finished rather than stopped." in result.stderr
    assert "Wrote" in result.stdout and (tmp_path / "o.mp4").stat().st_size > 1000
