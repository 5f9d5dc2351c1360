"""The render writes only what it creates and removes only what it wrote: links, somebody else's
partial file or journal folder, its own inputs and awkward output names are refused in one sentence
(or, with --force, an output or report link is replaced as a whole, never written through)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from avatar_render.cli import app
from avatar_render.job.journal import MARKER
from tests.folders import snapshot
from tests.media import speech_like, write_audio

ROOT = Path(__file__).resolve().parents[1]
TINY = ("video.width=48", "video.height=48", "chunk.chunk_frames=10", "chunk.transition_frames=4",
        "video.gop_seconds=0.4", "-q")


@pytest.fixture()
def d(tmp_path, face_png):
    (tmp_path / "face.png").write_bytes(face_png.read_bytes())
    write_audio(tmp_path / "talk.wav", speech_like(1.0, 16000), 16000)
    (tmp_path / "mine.txt").write_text("somebody's notes\n")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "keep.txt").write_text("keep me\n")
    return tmp_path


def render(d: Path, *args: str):
    base = ["render", "--ref", str(d / "face.png"), "--audio", str(d / "talk.wav")]
    if "-o" not in args:
        base += ["-o", str(d / "out.mp4")]
    return CliRunner().invoke(app, [*base, *args, *TINY])


def refused(result, words: str) -> None:
    assert result.exit_code == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and words in lines[0], result.stderr


def no_complete_output(d: Path) -> None:
    assert not (d / "out.mp4").exists() or (d / "out.mp4").is_symlink()


def _interrupted(d: Path, name: str) -> None:
    """What an interrupted render of NAME.mp4 leaves (its journal, with the marker, and its partial file)."""
    (d / f"{name}.mp4.journal").mkdir()
    (d / f"{name}.mp4.journal" / MARKER).write_text("")
    (d / f"{name}.partial.mp4").write_bytes(b"frames")


CASES = {  # name: (set-up of the folder, extra CLI arguments, words of the one error line)
    "partial is a link to a user's file": (lambda d: os.symlink(d / "mine.txt", d / "out.partial.mp4"), (),
                                           "no resume journal"),
    "partial is a link, with --force": (lambda d: os.symlink(d / "mine.txt", d / "out.partial.mp4"), ("--force",),
                                        "no resume journal"),
    "partial is a user's file": (lambda d: (d / "out.partial.mp4").write_text("mine"), (),
                                 "is not an interrupted render"),
    "partial is a user's file, with --force": (lambda d: (d / "out.partial.mp4").write_text("mine"), ("--force",),
                                               "is not an interrupted render"),
    "partial is a user's file, with --resume": (lambda d: (d / "out.partial.mp4").write_text("mine"), ("--resume",),
                                                "is not an interrupted render"),
    "partial is a folder": (lambda d: (d / "out.partial.mp4").mkdir(), (), "no resume journal"),
    "journal is a link to a folder": (lambda d: os.symlink(d / "theirs", d / "out.mp4.journal"), (),
                                      "was not made by it"),
    "journal is a link to a folder, with --force": (lambda d: os.symlink(d / "theirs", d / "out.mp4.journal"),
                                                    ("--force",), "was not made by it"),
    "journal is a folder without the marker": (lambda d: (d / "out.mp4.journal").mkdir(), ("--force",),
                                               "was not made by it"),
    "journal is a file": (lambda d: (d / "out.mp4.journal").write_text("x"), (), "was not made by it"),
    "journal marker is a link": (
        lambda d: ((d / "out.mp4.journal").mkdir(), os.symlink(d / "mine.txt", d / "out.mp4.journal" / MARKER)), (),
        "was not made by it"),
    "report is the audio": (lambda d: None, ("--report", "{d}/talk.wav"), "is the audio file"),
    "report is the reference": (lambda d: None, ("--report", "{d}/face.png", "--force"), "is the reference file"),
    "report is a link to the audio": (lambda d: os.symlink(d / "talk.wav", d / "r.json"),
                                      ("--report", "{d}/r.json", "--force"), "is the audio file"),
    "report is the output": (lambda d: None, ("--report", "{d}/out.mp4"), "is the output, which is written too"),
    "report is a folder": (lambda d: None, ("--report", "{d}/theirs"), "is a folder"),
    "report in a missing folder": (lambda d: None, ("--report", "{d}/nowhere/r.json"), "does not exist"),
    "report is a link": (lambda d: os.symlink(d / "mine.txt", d / "r.json"), ("--report", "{d}/r.json"),
                         "is a symbolic link"),
    "report is the config": (lambda d: (d / "c.yaml").write_text("seed: 1\n"),
                             ("--report", "{d}/c.yaml", "-c", "{d}/c.yaml"), "is the config file"),
    "output is the audio, with --force": (lambda d: write_audio(d / "talk.mp4", speech_like(1.0, 16000), 16000),
                                          ("--audio", "{d}/talk.mp4", "-o", "{d}/talk.mp4", "--force"),
                                          "is the audio file"),
    "output is a link to the reference, with --force": (
        lambda d: ((d / "face.mp4").write_bytes((d / "face.png").read_bytes()),
                   os.symlink(d / "face.mp4", d / "out.mp4")),
        ("--ref", "{d}/face.mp4", "--force"), "is the reference file"),
    "partial is the audio": (lambda d: write_audio(d / "out.partial.mp4", speech_like(1.0, 16000), 16000),
                             ("--audio", "{d}/out.partial.mp4", "--force"), "is the audio file"),
    "output is a dangling link": (lambda d: os.symlink(d / "gone.mp4", d / "out.mp4"), (),
                                  "is a symbolic link; pass --force"),
    "output is a link to a folder": (lambda d: os.symlink(d / "theirs", d / "out.mp4"), ("--force",), "is a folder"),
    "output is another render's partial, with --force": (
        lambda d: _interrupted(d, "other"), ("-o", "{d}/other.partial.mp4", "--force"), "belongs to the render of"),
    "output in another render's journal, with --force": (
        lambda d: _interrupted(d, "other"), ("-o", "{d}/other.mp4.journal/x.mp4", "--force"),
        "belongs to the render of"),
    "report is another render's partial, with --force": (
        lambda d: _interrupted(d, "other"), ("--report", "{d}/other.partial.mp4", "--force"),
        "belongs to the render of"),
    "output name too long for the journal": (lambda d: None, ("-o", "{d}/" + "n" * 246 + ".mp4"), "is too long"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_and_nothing_touched(d, case):
    setup, extra, words = CASES[case]
    setup(d)
    before = snapshot(d, mtimes=True)
    result = render(d, *(a.format(d=d) for a in extra))
    refused(result, words)
    assert snapshot(d, mtimes=True) == before
    no_complete_output(d)


def test_unwritable_report_folder_is_refused_before_the_first_frame(d):
    folder = d / "ro"
    folder.mkdir(mode=0o500)
    mounted = os.geteuid() == 0  # root writes into any folder, but not into a read-only file system
    if mounted and subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                                  capture_output=True).returncode:
        pytest.skip("needs a read-only mount as root")
    try:
        refused(render(d, "--report", str(folder / "r.json")), "is not writable")
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)
    assert not (d / "out.partial.mp4").exists() and not (d / "out.mp4.journal").exists()


def test_a_link_at_the_output_is_replaced_with_force_never_written_through(d):
    os.symlink(d / "mine.txt", d / "out.mp4")
    os.symlink(d / "gone.json", d / "r.json")
    before = (d / "mine.txt").read_bytes()
    result = render(d, "--force", "--report", str(d / "r.json"))
    assert result.exit_code == 0, result.stderr
    assert not (d / "out.mp4").is_symlink() and (d / "out.mp4").stat().st_size > 1000
    assert not (d / "r.json").is_symlink() and not (d / "gone.json").exists()
    assert (d / "mine.txt").read_bytes() == before


def test_a_user_file_next_to_the_render_named_like_its_temporaries_is_left_alone(d):
    """The report and journal files are written through temporaries of their own, never over names
    somebody may use (e.g. 'r.json.tmp')."""
    (d / "r.json.tmp").write_text("mine")
    result = render(d, "--report", str(d / "r.json"))
    assert result.exit_code == 0, result.stderr
    assert (d / "r.json.tmp").read_text() == "mine" and (d / "r.json").stat().st_size > 100


# The CLI, killed by SIGKILL right after the finished file was linked into place (before the journal's
# copy is removed): argv[1:] are the CLI's arguments.
KILL_IN_MOVE = """
import os, signal, sys
from avatar_render.job import loop
def move(src, dst, **kw):
    os.link(src, dst)
    os.kill(os.getpid(), signal.SIGKILL)
loop.move_into_place = move
from avatar_render.cli import main
sys.argv = ["avatar-render", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_killed_while_moving_into_place_then_resumed(d):
    args = ["render", "--ref", str(d / "face.png"), "--audio", str(d / "talk.wav"), *TINY]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    whole = subprocess.run([sys.executable, "-m", "avatar_render", *args, "-o", str(d / "whole.mp4")], env=env,
                           capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    killed = subprocess.run([sys.executable, "-c", KILL_IN_MOVE, *args, "-o", str(d / "out.mp4")], env=env,
                            capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL
    assert (d / "out.mp4.journal").is_dir() and (d / "out.mp4").exists()
    resumed = subprocess.run([sys.executable, "-m", "avatar_render", *[a for a in args if a != "-q"], "-o",
                              str(d / "out.mp4"), "--resume"],
                             env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "was complete" in resumed.stdout
    assert (d / "out.mp4").read_bytes() == (d / "whole.mp4").read_bytes()
    assert not (d / "out.mp4.journal").exists() and not (d / "out.partial.mp4").exists()


# The CLI, killed by SIGKILL at a point of its tidying up after the finished file was put in place (the
# environment's KILL_AT: "partial", before the partial file is removed; "journal", before the journal's first
# file is, once it holds the finished file; "complete", before that file is): argv[1:] are the CLI's arguments.
KILL_IN_TIDY = """
import os, signal, sys
from pathlib import Path
from avatar_render.job import journal, loop
at = os.environ["KILL_AT"]
def killing(remove, when):
    def call(path):
        if when(Path(path)):
            os.kill(os.getpid(), signal.SIGKILL)
        remove(path)
    return call
loop.remove = killing(loop.remove, lambda p: at == "partial" and p.name.endswith(".partial.mp4"))
journal.remove = killing(journal.remove, lambda p: (p.parent / journal.COMPLETE).exists() and (
    at == "journal" or at == "complete" and p.name == journal.COMPLETE))
from avatar_render.cli import main
sys.argv = ["avatar-render", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("at, force", [("partial", False), ("journal", False), ("complete", False),
                                       ("journal", True)])
def test_killed_while_tidying_up_then_resumed(d, at, force):
    """Whatever is left of the journal once the output is in place, --resume finds the output complete, says so
    and removes the rest (it had refused: the output exists)."""
    args = ["render", "--ref", str(d / "face.png"), "--audio", str(d / "talk.wav"), *TINY]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KILL_AT": at}
    whole = subprocess.run([sys.executable, "-m", "avatar_render", *args, "-o", str(d / "whole.mp4")], env=env,
                           capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    if force:  # (an older video of the user's is replaced)
        (d / "out.mp4").write_bytes(b"an older video")
    killed = subprocess.run([sys.executable, "-c", KILL_IN_TIDY, *args, "-o", str(d / "out.mp4"),
                             *(["--force"] if force else [])], env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (d / "out.mp4.journal").is_dir() and (d / "out.mp4").read_bytes() == (d / "whole.mp4").read_bytes()
    resumed = subprocess.run([sys.executable, "-m", "avatar_render", *[a for a in args if a != "-q"], "-o",
                              str(d / "out.mp4"), "--resume"], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "was complete" in resumed.stdout
    assert (d / "out.mp4").read_bytes() == (d / "whole.mp4").read_bytes()
    assert not (d / "out.mp4.journal").exists() and not (d / "out.partial.mp4").exists()


def test_a_report_that_cannot_be_written_says_the_video_is_complete(d, monkeypatch):
    """The disk fills between the video and its report: the error says the video was written (it is kept)."""
    import errno

    from avatar_render.job import loop

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(loop, "write_report", full)
    result = render(d, "--report", str(d / "r.json"))
    refused(result, f"'{d / 'out.mp4'}' is complete (")
    assert "but its report" in result.stderr and "no space left on device" in result.stderr
    assert (d / "out.mp4").stat().st_size > 1000 and not (d / "out.mp4.journal").exists()
