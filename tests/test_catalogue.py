"""A catalogue of bad and odd inputs, each run through the real CLI.

A refusal is exit 1 with one sentence on stderr that names the file or the key and the problem (no
traceback, no Python warning leaked); an odd but valid input renders right (ceil(duration x fps)
frames, a valid H.264/AAC MP4). In every case no file that was there before changes, and nothing that
looks like a complete output is left behind.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import stat
import struct
import subprocess
import sys
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from avatar_render.cli import app
from avatar_render.config import ConfigWarning
from tests.media import played_samples, speech_like, write_audio, write_video_without_audio, write_wav

ROOT = Path(__file__).resolve().parents[1]
TINY = ("video.width=48", "video.height=48")
FPS = 25
SECONDS = 0.4  # of most test audio: 10 frames, one chunk
NEWLINE_REF = "new\nline.png"


# -- the media, made once ---------------------------------------------------------------------


def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims ``width`` x ``height``, followed by a few bytes of pixel data."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(100))))


def _wav_claiming(path: Path, samples: np.ndarray, rate: int, data_bytes: int) -> None:
    """A 16-bit mono WAV whose header claims ``data_bytes`` of samples (a huge, lying header)."""
    write_wav(path, samples, rate)
    raw = bytearray(path.read_bytes())
    raw[4:8] = struct.pack("<I", min(36 + data_bytes, 0xFFFFFFFF))
    raw[40:44] = struct.pack("<I", data_bytes)
    path.write_bytes(bytes(raw))


def _images(d: Path, face_png: Path) -> None:
    face = Image.open(face_png).convert("RGB").resize((128, 128))
    face.save(d / "face.png")
    rgba = face.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize((128, 128)))
    rgba.save(d / "alpha.png")
    face.convert("L").save(d / "gray.png")
    gray16 = (np.asarray(face.convert("L"), np.uint16) * 257).astype(np.uint16)  # (H, W) 0..65535
    Image.fromarray(gray16).save(d / "gray16.png")
    face.convert("CMYK").save(d / "cmyk.jpg")
    face.convert("P", palette=Image.Palette.ADAPTIVE).save(d / "palette.png", transparency=0)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotated 90 degrees clockwise
    face.save(d / "rotated.jpg", exif=exif)
    face.save(d / "bad_exif.jpg", exif=b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\xff\xff\xff")  # (its first IFD cut short)
    face.save(d / "face.webp")
    face.resize((16, 2000)).save(d / "strip.png")
    Image.new("RGB", (1, 10000), (90, 120, 150)).save(d / "line.png")
    face.save(d / "visage é ü 😀.png")
    face.save(d / NEWLINE_REF)
    (d / "link.png").symlink_to("face.png")
    (d / "dangling.png").symlink_to("nowhere.png")
    (d / "loop_a.png").symlink_to("loop_b.png")
    (d / "loop_b.png").symlink_to("loop_a.png")
    png = (d / "face.png").read_bytes()
    (d / "cut.png").write_bytes(png[: len(png) // 2])
    jpg = (d / "rotated.jpg").read_bytes()
    (d / "cut.jpg").write_bytes(jpg[:600])
    (d / "zero.png").write_bytes(b"")
    (d / "notes.png").write_text("not an image\n" * 10)
    (d / "noise.jpg").write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    # (a phone's HEIC photo as far as its header goes; nothing here decodes HEVC stills)
    (d / "photo.heic").write_bytes(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(4000))
    _png_header_only(d / "huge_header.png", 100_000, 100_000)
    (d / "face.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="128" height="128">'
                                '<circle cx="64" cy="64" r="40" fill="#c96"/></svg>\n')


def _audio(d: Path) -> None:
    talk = speech_like(SECONDS, 16000)  # (1, n)
    write_audio(d / "talk.wav", talk, 16000)
    write_audio(d / "voix parlée.wav", talk, 16000)
    write_wav(d / "silence.wav", np.zeros((1, round(SECONDS * 16000))), 16000)
    write_wav(d / "one_sample.wav", talk[:, 3000:3001] + 0.1, 16000)
    write_wav(d / "u8.wav", talk, 16000, sample_format="u8")
    write_wav(d / "f64.wav", speech_like(SECONDS, 22050, 2), 22050, sample_format="f64")
    write_audio(d / "surround.wav", speech_like(SECONDS, 48000, 6), 48000)  # 5.1
    write_wav(d / "nine.wav", speech_like(SECONDS, 16000, 9), 16000)  # 9 channels in no known order
    write_wav(d / "rate4k.wav", speech_like(SECONDS, 4000), 4000)
    write_wav(d / "rate768k.wav", speech_like(0.2, 768_000), 768_000)
    for suffix in (".mp3", ".m4a", ".flac", ".opus"):
        write_audio(d / f"talk{suffix}", speech_like(SECONDS, 24000), 24000)
    write_audio(d / "talk.ogg", speech_like(SECONDS, 24000, 2), 24000)
    write_audio(d / "clip.mp4", speech_like(SECONDS, 22050), 22050)  # video + audio
    write_video_without_audio(d / "mute.mp4", SECONDS)
    nan = talk.copy()
    nan[0, round(0.2 * 16000)] = np.nan
    write_wav(d / "nan.wav", nan, 16000, sample_format="f32")
    inf = speech_like(SECONDS, 16000, 2)
    inf[1, round(0.3 * 16000)] = -np.inf
    write_wav(d / "inf.wav", inf, 16000, sample_format="f64")
    late = speech_like(10.0, 16000)
    late[0, round(9.5 * 16000)] = np.nan  # read long after the first chunks (2 s each) are on disk
    write_wav(d / "late_nan.wav", late, 16000, sample_format="f32")
    write_wav(d / "rate_huge.wav", talk, 2_147_483_647)
    write_wav(d / "rate_2hz.wav", talk[:, :40], 2)
    write_wav(d / "unknown_codec.wav", talk, 16000, format_tag=0x7777)
    write_wav(d / "no_samples.wav", np.zeros((1, 0)), 16000)
    _wav_claiming(d / "lying_header.wav", talk, 16000, 0xFFFFFF00)
    (d / "zero.mp3").write_bytes(b"")
    (d / "garbage.wav").write_bytes(bytes(range(256)) * 40)
    whole = (d / "talk.wav").read_bytes()
    (d / "header_only.wav").write_bytes(whole[:30])
    mp3 = (d / "talk.mp3").read_bytes()
    (d / "cut.mp3").write_bytes(mp3[: len(mp3) // 2])
    m4a = (d / "talk.m4a").read_bytes()
    (d / "cut.m4a").write_bytes(m4a[: len(m4a) // 2])
    mp4 = (d / "clip.mp4").read_bytes()
    (d / "cut.mp4").write_bytes(mp4[: len(mp4) // 2])


def _configs(d: Path) -> None:
    texts = {
        "list.yaml": "- video\n- chunk\n",
        "scalar.yaml": "42\n",
        "tabs.yaml": "video:\n\twidth: 48\n",
        "duplicate.yaml": "video:\n  width: 48\n  width: 64\n",
        "indent.yaml": "video:\n  width: 48\n   height: 48\n",
        "unclosed.yaml": "face:\n  box: [1, 2, 3\n",
        "unknown.yaml": "video:\n  width: 48\n  colour: red\n",
        "wrong_type.yaml": "video:\n  width: wide\n",
        "out_of_range.yaml": "video:\n  crf: 99\n",
        "group.yaml": "preview: 5\n",
        "seed.yaml": "seed: -1\n",
        "tag.yaml": "video: !!python/object/apply:os.getcwd []\n",
        "aliases.yaml": "a: &a [x, x, x, x, x, x, x, x, x, x]\n"  # each line ten times the last: a billion laughs
                        + "".join(f"{k}: &{k} [{', '.join(['*' + j] * 10)}]\n" for j, k in zip("abcdefg", "bcdefgh")),
        "dotted.yaml": "video.width: 48\n",
        "interpolation.yaml": "preview:\n  fps: ${nowhere}\n",
        "deep.yaml": "face: " + "[" * 5000 + "]" * 5000 + "\n",
        "nul.yaml": "video:\n  width: 4\x008\n",
        "empty.yaml": "",
        "comments.yaml": "# everything commented out\n# video:\n#   width: 48\n",
    }
    for name, text in texts.items():
        (d / name).write_text(text)
    (d / "bom_crlf.yaml").write_bytes("\ufeffvideo:\r\n  width: 48\r\n  height: 48\r\n".encode())
    (d / "big.yaml").write_bytes(b"# " + b"x" * (2 << 20) + b"\n")


def _special_files(d: Path) -> None:
    os.mkfifo(d / "fifo")
    (d / "folder").mkdir()
    (d / "folder" / "inside.txt").write_text("a file in a folder\n")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(d / "sock"))  # the socket file stays after the socket is closed


@pytest.fixture(scope="module")
def media(tmp_path_factory, face_png) -> Path:
    d = tmp_path_factory.mktemp("catalogue")
    _images(d, face_png)
    _audio(d)
    _configs(d)
    _special_files(d)
    return d


# -- what every case checks -------------------------------------------------------------------


def tree(*folders: Path) -> dict[str, tuple]:
    """Every entry below ``folders``, not following links: kind, size, mtime and (regular files) SHA-256."""
    state = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            st = path.lstat()
            entry: tuple = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
            if stat.S_ISREG(st.st_mode):
                entry += (hashlib.sha256(path.read_bytes()).hexdigest(),)
            elif stat.S_ISLNK(st.st_mode):
                entry += (os.readlink(path),)
            state[str(path)] = entry
    return state


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    stdout: str
    stderr: str
    warned: tuple[str, ...] = ()  # Python warnings raised in the process (not the CLI's own "Warning:" lines)


def run_cli(args: list[str]) -> Outcome:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    leaked = tuple(f"{w.category.__name__}: {w.message}" for w in caught
                   if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, ConfigWarning)))
    return Outcome(result.exit_code, result.stdout, result.stderr, leaked)


def run_process(args: list[str]) -> Outcome:
    """The CLI in its own process, for inputs that could block a reader forever (a FIFO)."""
    done = subprocess.run([sys.executable, "-m", "avatar_render", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    return Outcome(done.returncode, done.stdout, done.stderr)


def error_line(outcome: Outcome) -> str:
    """The one error sentence; anything else on stderr may only be the CLI's warnings."""
    assert "Traceback" not in outcome.stdout + outcome.stderr
    assert not outcome.warned, outcome.warned
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1 and all(line.startswith(("Error: ", "Warning: ")) for line in lines), outcome.stderr
    line = errors[0]
    assert line.endswith(".") and "internal error" not in line, line
    return line


def input_seconds(path: Path) -> float:
    """What a player plays of the first audio track, in seconds."""
    n, rate = played_samples(path)
    return n / rate


def check_render(outcome: Outcome, out: Path, audio: Path) -> None:
    assert outcome.exit_code == 0, outcome.stderr
    assert "Traceback" not in outcome.stdout + outcome.stderr and not outcome.warned, (outcome.stderr, outcome.warned)
    assert all(line.startswith("Warning: ") for line in outcome.stderr.splitlines() if line.strip()), outcome.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no partial file, no journal
    seconds = input_seconds(audio)
    with av.open(str(out)) as c:
        video, sound = c.streams.video[0], c.streams.audio[0]
        assert video.codec_context.name == "h264" and sound.codec_context.name == "aac"
        assert (video.codec_context.width, video.codec_context.height) == (48, 48)
        frames = sum(1 for _ in c.decode(video))
    assert frames == math.ceil(seconds * FPS) >= 1
    with av.open(str(out)) as c:
        stream = c.streams.audio[0]
        end = max(float((p.pts + p.duration) * stream.time_base) for p in c.demux(stream) if p.size)
    assert abs(end - seconds) <= 1 / FPS + 0.03  # AAC frames round the end up


# -- the catalogue ----------------------------------------------------------------------------

RENDERS = None  # in place of an error's words: the case must render


@dataclass(frozen=True)
class Case:
    words: str | None  # what the error sentence must hold; RENDERS: it must render
    ref: str = "face.png"  # names in the media folder (or a path anywhere)
    audio: str = "talk.wav"
    args: tuple[str, ...] = ()  # more arguments; "{d}" is the media folder
    process: bool = False  # run in a subprocess (a FIFO could block an in-process reader for good)


CASES = {
    # The reference: not a regular file.
    "ref: a FIFO": Case("'{d}/fifo' is a named pipe (FIFO), not a regular file", ref="fifo", process=True),
    "ref: a character device": Case("'/dev/null' is a character device, not a regular file", ref="/dev/null"),
    "ref: a socket": Case("'{d}/sock' is a socket, not a regular file", ref="sock"),
    "ref: a folder": Case("'{d}/folder' is a folder, not a regular file", ref="folder"),
    "ref: missing": Case("'{d}/missing.png' does not exist", ref="missing.png"),
    "ref: dangling symlink": Case(
        "'{d}/dangling.png' is a symbolic link to a file that does not exist", ref="dangling.png"),
    "ref: symlink loop": Case("'{d}/loop_a.png' is a symbolic link that loops back on itself", ref="loop_a.png"),
    "ref: missing, newline in the name": Case(r"'{d}/no\nsuch.png' does not exist", ref="no\nsuch.png"),
    # The reference: broken or unusable media.
    "ref: SVG (opens, nothing decodes it)": Case(
        "'{d}/face.svg' is in a format nothing here can decode", ref="face.svg"),
    "ref: zero bytes": Case("'{d}/zero.png' is empty (0 bytes); give an image or video file", ref="zero.png"),
    "ref: text named .png": Case("'{d}/notes.png' is not an image or video file that can be read", ref="notes.png"),
    "ref: random bytes named .jpg": Case(
        "'{d}/noise.jpg' is not an image or video file that can be read", ref="noise.jpg"),
    "ref: a HEIC photo": Case("'{d}/photo.heic' is a HEIC photo, which cannot be read here; save it as JPEG or PNG",
                              ref="photo.heic"),
    "ref: truncated PNG": Case("'{d}/cut.png' is corrupt or truncated", ref="cut.png"),
    "ref: truncated JPEG": Case("'{d}/cut.jpg' is corrupt or truncated", ref="cut.jpg"),
    "ref: header claims 100000x100000": Case("'{d}/huge_header.png' is too large", ref="huge_header.png"),
    "ref: 1x10000 image": Case("'{d}/line.png' is only 1x10000 pixels; it must be at least 16x16", ref="line.png"),
    "ref: an audio file": Case("'{d}/talk.wav' has no video stream", ref="talk.wav"),
    "ref: an MP4 cut in half": Case("The reference video '{d}/cut.mp4' cannot be opened", ref="cut.mp4"),
    "ref: no face, run.no_face=error": Case("No face was found in the reference 'clip.mp4'", ref="clip.mp4",
                                            args=("run.no_face=error",)),
    # The audio: not a regular file.
    "audio: a FIFO": Case("'{d}/fifo' is a named pipe (FIFO), not a regular file", audio="fifo", process=True),
    "audio: a character device": Case("'/dev/zero' is a character device, not a regular file", audio="/dev/zero"),
    "audio: a socket": Case("'{d}/sock' is a socket, not a regular file", audio="sock"),
    "audio: a folder": Case("'{d}/folder' is a folder, not a regular file", audio="folder"),
    "audio: missing": Case("'{d}/missing.wav' does not exist", audio="missing.wav"),
    # The audio: broken or unusable media.
    "audio: zero bytes": Case("'{d}/zero.mp3' is empty (0 bytes); give an audio or video file", audio="zero.mp3"),
    "audio: garbage": Case("'{d}/garbage.wav' is not a readable audio or video file", audio="garbage.wav"),
    "audio: truncated header": Case(
        "'{d}/header_only.wav' is not a readable audio or video file", audio="header_only.wav"),
    "audio: header, no samples": Case("'{d}/no_samples.wav' holds no audio samples", audio="no_samples.wav"),
    "audio: m4a cut in half": Case("'{d}/cut.m4a' is not a readable audio or video file", audio="cut.m4a"),
    "audio: codec no decoder knows": Case("'{d}/unknown_codec.wav' holds an audio track that nothing here can decode",
                                          audio="unknown_codec.wav"),
    "audio: a video without sound": Case("'{d}/mute.mp4' has no audio track", audio="mute.mp4"),
    "audio: an image": Case("'{d}/face.png' has no audio track", audio="face.png"),
    "audio: NaN sample": Case("'{d}/nan.wav' has a NaN sample at 0.200 s", audio="nan.wav"),
    "audio: infinite sample, 2nd channel": Case("'{d}/inf.wav' has an infinite sample at 0.300 s", audio="inf.wav"),
    "audio: sample rate 2147483647 Hz": Case(
        "'{d}/rate_huge.wav' has a sample rate of 2147483647 Hz", audio="rate_huge.wav"),
    "audio: sample rate 2 Hz": Case("'{d}/rate_2hz.wav' has a sample rate of 2 Hz", audio="rate_2hz.wav"),
    # -c: not a usable file.
    "-c: a FIFO": Case(
        "The config file '{d}/fifo' is a named pipe (FIFO), not a regular file", args=("-c", "{d}/fifo"), process=True),
    "-c: a folder": Case("The config file '{d}/folder' is a folder, not a regular file", args=("-c", "{d}/folder")),
    "-c: a character device": Case("The config file '/dev/zero' is a character device", args=("-c", "/dev/zero")),
    "-c: missing": Case("The config file '{d}/missing.yaml' does not exist", args=("-c", "{d}/missing.yaml")),
    "-c: the audio": Case("The config file '{d}/talk.wav' is not a text file", args=("-c", "{d}/talk.wav")),
    "-c: the reference": Case("The config file '{d}/face.png' is not a text file", args=("-c", "{d}/face.png")),
    "-c: 2 MB": Case("The config file '{d}/big.yaml' is 2 MB, far too large for a config", args=("-c", "{d}/big.yaml")),
    # -c: YAML that is not a config.
    "yaml: a list": Case(
        "'{d}/list.yaml' must hold a mapping of keys to values, not a list", args=("-c", "{d}/list.yaml")),
    "yaml: a scalar": Case(
        "'{d}/scalar.yaml' must hold a mapping of keys to values, not a single value", args=("-c", "{d}/scalar.yaml")),
    "yaml: tabs": Case(
        "'{d}/tabs.yaml' is not valid YAML: found character that cannot start any token at line 2, column 1 "
        "(a tab: YAML indents with spaces only)", args=("-c", "{d}/tabs.yaml")),
    "yaml: duplicate key": Case("'{d}/duplicate.yaml' is not valid YAML: found duplicate key width at line 3, column 3",
                                args=("-c", "{d}/duplicate.yaml")),
    "yaml: bad indentation": Case(
        "'{d}/indent.yaml' is not valid YAML: mapping values are not allowed in this context at line 3, column 10",
        args=("-c", "{d}/indent.yaml")),
    "yaml: unclosed bracket": Case(
        "'{d}/unclosed.yaml' is not valid YAML: did not find expected ',' or ']' at line 3, column 1, "
        "while parsing a flow sequence at line 2, column 8", args=("-c", "{d}/unclosed.yaml")),
    "yaml: python tag": Case(
        "'{d}/tag.yaml' is not valid YAML: could not determine a constructor for the tag", args=("-c", "{d}/tag.yaml")),
    "yaml: alias bomb": Case(
        "'{d}/aliases.yaml' is not valid YAML: YAML node expansion exceeds the configured limit of",
        args=("-c", "{d}/aliases.yaml")),
    "yaml: a dotted key": Case("'{d}/dotted.yaml' writes the key 'video.width' with a dot; in YAML nest it instead",
                               args=("-c", "{d}/dotted.yaml")),
    "yaml: interpolation to nowhere": Case(
        "Config key 'preview.fps' cannot be read: Interpolation key 'nowhere' not found",
        args=("-c", "{d}/interpolation.yaml")),
    "yaml: nested 5000 deep": Case("'{d}/deep.yaml' is not valid YAML: exceeded maximum nesting depth at line 1",
                                   args=("-c", "{d}/deep.yaml")),
    "yaml: a NUL byte": Case(
        "'{d}/nul.yaml' is not valid YAML: unacceptable character #x0000", args=("-c", "{d}/nul.yaml")),
    "yaml: unknown key": Case("Unknown config key 'video.colour'", args=("-c", "{d}/unknown.yaml")),
    "yaml: wrong type": Case("Config key 'video.width' has a wrong type or value", args=("-c", "{d}/wrong_type.yaml")),
    "yaml: out of range": Case("Config key 'video.crf' must be between 0 and 51", args=("-c", "{d}/out_of_range.yaml")),
    "yaml: a group set to a value": Case(
        "'{d}/group.yaml' sets the whole group 'preview' to a single value", args=("-c", "{d}/group.yaml")),
    "yaml: negative seed": Case("Config key 'seed' must be a whole number from 0 to", args=("-c", "{d}/seed.yaml")),
    # Overrides and options.
    "override: no key": Case("Override '=25' has no key before '='", args=("=25",)),
    "override: a whole group": Case(
        "Override 'preview=5' sets the whole group 'preview' to a single value", args=("preview=5",)),
    "override: empty name in the key": Case(
        "Override 'video..width=4' has an empty name in its key 'video..width'", args=("video..width=4",)),
    "override: no '='": Case("Override 'preview.fps' is not of the form key=value", args=("preview.fps",)),
    "override: unknown key": Case("Unknown config key 'preview.fsp'; perhaps 'preview.fps'.", args=("preview.fsp=30",)),
    "override: a key of another section": Case("Unknown config key 'video.fps'; perhaps 'preview.fps' or 'model.fps'.",
                                               args=("video.fps=30",)),
    "override: nothing like it": Case("Unknown config key 'colour_grade'.", args=("colour_grade=warm",)),
    "override: wrong type": Case("Config key 'video.height' has a wrong type or value", args=("video.height=tall",)),
    "override: float for an int list": Case(
        "Config key 'face.box[0]' has a wrong type or value", args=("face.box=[1.5,2,30,30]",)),
    "override: face.box of 2": Case("Config key 'face.box' must be [x, y, width, height]", args=("face.box=[1,2]",)),
    "override: face.landmarks a folder": Case(
        "The face landmark model '{d}/folder' (face.landmarks) is a folder, not the model's file",
        args=("face.landmarks={d}/folder",)),
    "audio: a web address": Case(
        "--audio 'http://127.0.0.1:1/talk.wav' is a web address; give a local file", audio="http://127.0.0.1:1/talk.wav"),
    "override: face.box at a negative x": Case("Config key 'face.box' must be [x, y, width, height]: x and y 0 or more",
                                               args=("face.box=[-10,6,100,100]",)),
    "override: face.box past the picture's corner": Case(
        "face.box=[100, 100, 60, 60] puts the eyes or the mouth outside the reference, which is 128x128 pixels",
        args=("face.box=[100,100,60,60]",)),
    "override: face.box past the whole picture": Case(
        "face.box=[0, 0, 10000, 10000] puts the eyes or the mouth outside the reference",
        args=("face.box=[0,0,10000,10000]",)),
    "override: odd width": Case(
        "Config key 'video.width' must be an even number from 16 to 16384", args=("video.width=47",)),
    "override: width 20000": Case(
        "Config key 'video.width' must be an even number from 16 to 16384", args=("video.width=20000",)),
    "override: crf -1": Case("Config key 'video.crf' must be between 0 and 51", args=("video.crf=-1",)),
    "override: unknown preset": Case(
        "Config key 'video.preset' must be one of ultrafast", args=("video.preset=fastest",)),
    "override: mouth_gain inf": Case(
        "Config key 'preview.mouth_gain' must be a finite number, not inf", args=("preview.mouth_gain=inf",)),
    "override: mouth_gain 1e300": Case(
        "Config key 'preview.mouth_gain' must be between 0 and 2", args=("preview.mouth_gain=1e300",)),
    "override: blink interval inf": Case("Config key 'preview.blink_interval_s' must be a finite number, not inf",
                                         args=("preview.blink_interval_s=inf",)),
    "override: transcript missing": Case("The transcript file '{d}/missing.txt' was not found",
                                         args=("preview.transcript={d}/missing.txt",)),
    "override: transcript a folder": Case("The transcript '{d}/folder' is a folder, not a text file",
                                          args=("preview.transcript={d}/folder",)),
    "override: fps nan": Case("Config key 'preview.fps' must be a finite number, not nan", args=("preview.fps=nan",)),
    "override: zero chunk": Case("Config key 'chunk.chunk_frames' must be at least 1", args=("chunk.chunk_frames=0",)),
    "override: unknown backend": Case(
        "Config key 'backend' must be one of preview, infinitetalk", args=("backend=magic",)),
    "override: negative seed": Case("Config key 'seed' must be a whole number from 0 to", args=("seed=-1",)),
    "--seed -1": Case(
        "--seed -1 is not a seed: give a whole number from 0 to 18446744073709551615", args=("--seed", "-1")),
    "--seed 2**64": Case("--seed 18446744073709551616 is not a seed", args=("--seed", str(2**64))),
    # Odd but valid: these render.
    "renders: silence only": Case(RENDERS, audio="silence.wav"),
    "renders: one sample of audio": Case(RENDERS, audio="one_sample.wav"),
    "renders: 8-bit mono WAV": Case(RENDERS, audio="u8.wav"),
    "renders: float64 stereo WAV": Case(RENDERS, audio="f64.wav"),
    "renders: 5.1 WAV": Case(RENDERS, audio="surround.wav"),
    "renders: 9 channels in no known order": Case(RENDERS, audio="nine.wav"),
    "renders: 4 kHz": Case(RENDERS, audio="rate4k.wav"),
    "renders: 768 kHz": Case(RENDERS, audio="rate768k.wav"),
    "renders: WAV header claiming 4 GB": Case(RENDERS, audio="lying_header.wav"),
    "renders: mp3": Case(RENDERS, audio="talk.mp3"),
    "renders: mp3 cut in half": Case(RENDERS, audio="cut.mp3"),
    "renders: ogg": Case(RENDERS, audio="talk.ogg"),
    "renders: opus": Case(RENDERS, audio="talk.opus"),
    "renders: m4a": Case(RENDERS, audio="talk.m4a"),
    "renders: flac": Case(RENDERS, audio="talk.flac"),
    "renders: a video as the audio": Case(RENDERS, audio="clip.mp4"),
    "renders: a video as the reference": Case(RENDERS, ref="clip.mp4"),
    "renders: RGBA reference": Case(RENDERS, ref="alpha.png"),
    "renders: grayscale reference": Case(RENDERS, ref="gray.png"),
    "renders: 16-bit grayscale reference": Case(RENDERS, ref="gray16.png"),
    "renders: CMYK JPEG reference": Case(RENDERS, ref="cmyk.jpg"),
    "renders: palette PNG with transparency": Case(RENDERS, ref="palette.png"),
    "renders: EXIF-rotated JPEG": Case(RENDERS, ref="rotated.jpg"),
    "renders: JPEG with corrupt EXIF, no warning leaked": Case(RENDERS, ref="bad_exif.jpg"),
    "renders: WebP reference": Case(RENDERS, ref="face.webp"),
    "renders: 16x2000 reference": Case(RENDERS, ref="strip.png"),
    "renders: reference through a symlink": Case(RENDERS, ref="link.png"),
    "renders: unicode and spaces in the paths": Case(RENDERS, ref="visage é ü 😀.png", audio="voix parlée.wav"),
    "renders: a newline in the reference's name": Case(RENDERS, ref=NEWLINE_REF),
    "renders: empty YAML": Case(RENDERS, args=("-c", "{d}/empty.yaml")),
    "renders: YAML of comments only": Case(RENDERS, args=("-c", "{d}/comments.yaml")),
    "renders: YAML with a BOM and CRLF": Case(RENDERS, args=("-c", "{d}/bom_crlf.yaml")),
}


def _where(name: str, d: Path) -> str:
    return name if name.startswith("/") or "://" in name else str(d / name)


@pytest.mark.parametrize("name", list(CASES))
def test_catalogue(media, tmp_path, name):
    case = CASES[name]
    out = tmp_path / "out.mp4"
    args = ["render", "--ref", _where(case.ref, media), "--audio", _where(case.audio, media), "-o", str(out), *TINY,
            *(a.replace("{d}", str(media)) for a in case.args)]
    before = tree(media)
    outcome = (run_process if case.process else run_cli)(args)
    if case.words is RENDERS:
        check_render(outcome, out, Path(_where(case.audio, media)))
    else:
        assert outcome.exit_code == 1, (outcome.exit_code, outcome.stderr)
        assert case.words.replace("{d}", str(media)) in error_line(outcome)
        assert not any(tmp_path.iterdir())  # no output, no partial file, no journal
    assert tree(media) == before  # every input untouched


def test_relative_paths(media, tmp_path, monkeypatch):
    monkeypatch.chdir(media)
    out = tmp_path / "out.mp4"
    before = tree(media)
    check_render(run_cli(["render", "--ref", "face.png", "--audio", "./talk.wav", "-o", os.path.relpath(out), *TINY]),
                 out, media / "talk.wav")
    assert tree(media) == before


def _late_nan(media: Path, out: Path, *extra: str) -> Outcome:
    return run_cli(["render", "--ref", str(media / "face.png"), "--audio", str(media / "late_nan.wav"), "-o", str(out),
                    *TINY, *extra])


def test_audio_error_found_mid_render(media, tmp_path):
    """A NaN 9.5 s in is read after chunks are on disk: one sentence, nothing that looks complete, inputs untouched."""
    out = tmp_path / "out.mp4"
    before = tree(media)
    outcome = _late_nan(media, out)
    assert outcome.exit_code == 1
    assert f"'{media}/late_nan.wav' has a NaN sample at 9.500 s" in error_line(outcome)
    assert not out.exists() and tree(media) == before
    # What is left, if anything, is the interrupted render: its partial file and journal.
    assert {p.name for p in tmp_path.iterdir()} <= {"out.partial.mp4", "out.mp4.journal"}


def test_audio_error_found_mid_render_does_not_advise_resume(media, tmp_path):
    """The fixed audio is another input, which a resume refuses: the advice is to start over."""
    outcome = _late_nan(media, tmp_path / "out.mp4", "video.gop_seconds=1")
    assert (tmp_path / "out.mp4.journal").exists(), "a keyframe was committed before the error was found"
    assert "--resume" not in error_line(outcome) and "start over with --force" in error_line(outcome)


@pytest.mark.parametrize("args", [["--seed", "abc"], []], ids=["--seed abc", "no --audio"])
def test_usage_errors_are_one_line(media, tmp_path, args):
    audio = ["--audio", str(media / "talk.wav")] if args else []
    outcome = run_cli(["render", "--ref", str(media / "face.png"), *audio, "-o", str(tmp_path / "o.mp4"), *args])
    assert outcome.exit_code == 2
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert [line for line in lines if "Error" in line] == lines[-1:] and lines[-1].startswith("Error: ")
