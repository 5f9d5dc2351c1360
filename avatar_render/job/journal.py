"""The resume journal of one render, in a folder beside the output (``out.mp4.journal/``).

* ``journal.json``: what the render started from (software version, config, size and SHA-256 of
  both inputs) and its last commit: chunk-plan entries done, frames and audio samples published,
  where the partial MP4's last whole fragment ends, and the state file that goes with it.
* ``state-N.safetensors``: the rolling state at that commit (arrays as tensors, the structure as
  JSON in the header's metadata; see ``pipeline.state.flatten``).
* ``chunks.jsonl``: one line per published chunk: frame range, SHA-256 of the H.264 its frames were
  encoded to and of its audio samples.
* ``lock``: held (flock) by the process that renders, so two never write one output.
* ``.avatar-render-journal``: the marker written when the folder was made. A folder at the journal's
  path without it (or a link) is somebody else's: it is refused, never written to or removed.

A commit runs on the writer thread once the chunk's fragment is on disk: the state file is written
(temporary name, then renamed), the chunk lines appended, then ``journal.json`` is replaced
atomically; a crash at any point leaves the previous commit whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import os_reason, shown
from avatar_render.files.render_paths import JOURNAL_MARKER
from avatar_render.files.write import (
    create_new,
    make_folder,
    open_lock,
    open_own,
    remove,
    remove_tree,
    replace_atomically,
)
from avatar_render.io.writer import WriterPosition
from avatar_render.pipeline.state import Checkpoint, Flat, flatten, unflatten
from avatar_render.pipeline.types import Published

FORMAT = 3  # 2: commits fall on GOP starts (byte-exact resume); 3: chunks recorded by their encoded video
MARKER = JOURNAL_MARKER
COMPLETE = "complete.mp4"  # the finished file, made from the partial one and put in place from here
NEUTRAL_KEYS = frozenset({"run.queue_chunks", "run.no_face"})  # config keys that cannot change the frames
_WHOLE_HASH_MAX = 64 << 20  # inputs up to this size are hashed whole; larger ones by samples
_BLOCK, _BLOCKS = 1 << 20, 16
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
           "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}


@dataclass(frozen=True)
class ChunkRecord:
    kind: str
    index: int
    start: int
    end: int
    # Of the chunk's H.264 samples as written (AVCC): in the same run and config, the same frames encode to the
    # same bytes (a GOP's bytes depend only on its frames), and they are a few hundredths of the raw frames'
    # bytes (whose SHA-256 was 0.7 ms a frame at 512x512 and 5.5 ms at 1080p: a tenth of the render's CPU).
    video_sha256: str
    audio_sha256: str  # of the (C, n) float32 output samples
    audio_samples: int

    @staticmethod
    def of(pub: Published, video_sha256: str) -> ChunkRecord:
        audio = np.ascontiguousarray(pub.audio, dtype="<f4")
        return ChunkRecord(kind=pub.plan.kind, index=pub.plan.index, start=pub.whole_start, end=pub.end,
                           video_sha256=video_sha256,
                           audio_sha256=hashlib.sha256(audio.data).hexdigest(), audio_samples=audio.shape[1])


@dataclass(frozen=True)
class Commit:
    plans_done: int
    frames: int  # published, in the partial file
    audio_samples: int
    chunks: int  # lines of chunks.jsonl that belong to this commit
    log_bytes: int  # their length in bytes
    state_file: str
    writer: WriterPosition


def fingerprint(path: Path) -> dict[str, Any]:
    """Size and SHA-256 of a file: of all of it up to 64 MiB, else of 16 spread 1 MiB blocks."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= _WHOLE_HASH_MAX:
            for block in iter(lambda: f.read(_BLOCK), b""):
                digest.update(block)
        else:
            for i in range(_BLOCKS):
                f.seek((size - _BLOCK) * i // (_BLOCKS - 1))
                digest.update(f.read(_BLOCK))
    return {"name": path.name, "size": size, "sha256": digest.hexdigest(), "whole": size <= _WHOLE_HASH_MAX}


def _seconds(gop: float) -> str:
    return "chunk" if gop < 1e-3 else f"{gop:g} s"


def identity(config: dict[str, Any], reference: Path, audio: Path | str) -> dict[str, Any]:
    """What a render started from; resuming needs the same. A stream (a session) is named, with its
    duration open: a session is never resumed."""
    try:
        version = metadata.version("avatar-render")
    except metadata.PackageNotFoundError:
        version = "unknown"
    out = {"version": version, "config": config, "reference": fingerprint(Path(reference)),
           "audio": {"stream": str(audio), "open_duration": True} if isinstance(audio, str) else fingerprint(audio)}
    transcript = (config.get("preview") or {}).get("transcript")  # (the words the mouth follows, when given)
    if transcript:
        out["transcript"] = fingerprint(Path(transcript))
    return out


def snapshot(checkpoint: Checkpoint) -> Flat:
    """The checkpoint flattened into own copies (safe to hand to the writer thread)."""
    flat = flatten(checkpoint)
    for name, a in flat.arrays.items():
        if a.dtype.newbyteorder("<") not in _CODES:
            raise TypeError(f"rolling state array {name} has dtype {a.dtype}, which cannot be saved")
    return flat


class Journal:
    """An open journal folder, locked for this process. See the module docstring."""

    def __init__(self, directory: Path, lock_fd: int) -> None:
        self.dir = directory
        self._lock_fd = lock_fd
        self.meta: Optional[dict[str, Any]] = None
        self.damaged: Optional[str] = None  # why journal.json cannot be used
        try:
            self.meta = json.loads((directory / "journal.json").read_text())
            if self.meta.get("format") != FORMAT:
                self.meta, self.damaged = None, f"it has format {self.meta.get('format')!r}, not {FORMAT}"
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as exc:
            self.damaged = f"its journal.json cannot be read ({exc})"

    @classmethod
    def open(cls, directory: Path, *, create: bool) -> Optional[Journal]:
        """Lock and read the journal in ``directory``; None when there is none and ``create`` is false.
        Anything at that path that this program did not make is refused."""
        if not os.path.lexists(directory):
            if not create:
                return None
            try:
                make_folder(directory)
                create_new(directory / MARKER).close()
            except OSError as exc:
                raise AvatarRenderError(
                    f"Could not create the resume journal {shown(directory)}: {os_reason(exc)}.") from None
        check_ours(directory)
        try:
            fd = open_lock(directory / "lock")
        except OSError as exc:
            raise AvatarRenderError(
                f"Could not open the resume journal {shown(directory)}: {os_reason(exc)}.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AvatarRenderError("Another avatar-render process is writing this output right now (its journal "
                                    f"{shown(directory)} is locked).") from None
        return cls(directory, fd)

    @property
    def commit_info(self) -> Optional[Commit]:
        data = (self.meta or {}).get("commit")
        if not data:
            return None
        return Commit(**{**data, "writer": WriterPosition(**data["writer"])})

    def begin(self, ident: dict[str, Any]) -> None:
        """Start afresh: forget everything but the lock."""
        try:
            for entry in self.dir.iterdir():
                if entry.name not in ("lock", MARKER):
                    remove_tree(entry) if entry.is_dir() and not entry.is_symlink() else remove(entry)
            _write_atomic(self.dir / "chunks.jsonl", b"")
            self.meta = {"format": FORMAT, "identity": ident, "commit": None}
            _write_atomic(self.dir / "journal.json", json.dumps(self.meta, indent=1).encode())
        except OSError as exc:
            raise AvatarRenderError(
                f"Could not write the resume journal {shown(self.dir)}: {os_reason(exc)}.") from None
        self.damaged = None

    def mismatch(self, ident: dict[str, Any]) -> Optional[str]:
        """How ``ident`` differs from what the render started from (a clause), or None."""
        old = (self.meta or {}).get("identity", {})
        if old.get("version") != ident["version"]:
            return f"it was started by avatar-render {old.get('version')} and this is {ident['version']}"
        for key in ("reference", "audio", "transcript"):  # the content counts, not the name
            before, now = old.get(key) or {}, ident.get(key) or {}
            if (before.get("size"), before.get("sha256")) != (now.get("size"), now.get("sha256")):
                return f"the {key} '{now.get('name', before.get('name'))}' is not the file it was started with"
        for key, before, now in _differences(old.get("config", {}), ident["config"]):
            if key not in NEUTRAL_KEYS:
                return f"the config key {shown(key)} was {before!r} and is now {now!r}"
        before, now = old.get("gop_seconds"), ident.get("gop_seconds")
        if before is not None and now is not None and before != now:
            return (f"it was started with a keyframe every {_seconds(before)} and would now have one every "
                    f"{_seconds(now)} (with video.gop_seconds unset --serve and --live shorten it to 2 s, "
                    "--underrun hold to every chunk: resume with the live options it was started with)")
        return None

    def resume_point(self) -> tuple[Checkpoint, list[ChunkRecord]]:
        """The last commit's checkpoint and chunk records; the folder is tidied back to that commit."""
        commit = self.commit_info
        assert commit is not None
        try:
            arrays, meta = read_safetensors(self.dir / commit.state_file)
            checkpoint = unflatten(Flat(arrays=arrays, skeleton=json.loads(meta["skeleton"])))
            log = self.dir / "chunks.jsonl"
            with open_own(log, "r+b") as f:
                data = f.read(commit.log_bytes)
                f.truncate(commit.log_bytes)
            records = [ChunkRecord(**json.loads(line)) for line in data.splitlines()]
            for entry in self.dir.glob("state-*"):
                if entry.name != commit.state_file:
                    remove(entry)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AvatarRenderError(f"The resume journal {shown(self.dir)} is damaged ({exc}).") from None
        if not isinstance(checkpoint, Checkpoint) or len(records) != commit.chunks:
            raise AvatarRenderError(f"The resume journal {shown(self.dir)} is damaged (it does not hold "
                                    f"{commit.chunks} chunks and a checkpoint).")
        return checkpoint, records

    def commit(self, flat: Flat, records: list[ChunkRecord], position: WriterPosition, *,
               plans_done: int, frames: int, audio_samples: int) -> None:
        """Record a checkpoint (``flat``, after ``plans_done`` plan entries) whose frames are all in the
        partial file up to ``position``; ``records`` are the chunks published since the last commit."""
        assert self.meta is not None
        previous = self.commit_info
        state_file = f"state-{plans_done:08d}.safetensors"
        try:
            write_safetensors(self.dir / state_file, flat.arrays, {"skeleton": json.dumps(flat.skeleton)})
            with open_own(self.dir / "chunks.jsonl", "ab") as log:
                if previous is None:
                    log.truncate(0)
                log.write(b"".join(json.dumps(dataclasses.asdict(r)).encode() + b"\n" for r in records))
                log_bytes = log.tell()
            meta = {**self.meta, "commit": {
                "plans_done": plans_done, "frames": frames, "audio_samples": audio_samples,
                "chunks": (previous.chunks if previous else 0) + len(records), "log_bytes": log_bytes,
                "state_file": state_file, "writer": dataclasses.asdict(position),
            }}
            _write_atomic(self.dir / "journal.json", json.dumps(meta, indent=1).encode())
            self.meta = meta
            if previous is not None and previous.state_file != state_file:
                remove(self.dir / previous.state_file)
        except OSError as exc:
            raise AvatarRenderError(
                f"Could not write the resume journal {shown(self.dir)}: {os_reason(exc)}.") from None

    def discard(self) -> None:
        remove_journal(self.dir)

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_safetensors(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, str]) -> None:
    """A safetensors file (8-byte little-endian header size, JSON header, raw little-endian data)."""
    header: dict[str, Any] = {"__metadata__": meta}
    offset, blobs = 0, []
    for name, a in arrays.items():
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        header[name] = {"dtype": _CODES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    _write_atomic(path, struct.pack("<Q", len(raw)) + raw, blobs)


def read_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    meta = header.pop("__metadata__", {})
    base, arrays = 8 + size, {}
    for name, spec in header.items():
        begin, end = spec["data_offsets"]
        if base + end > len(data):
            raise ValueError(f"{path.name} is cut short")
        a = np.frombuffer(data, dtype=_DTYPES[spec["dtype"]], count=int(np.prod(spec["shape"])), offset=base + begin)
        arrays[name] = a.reshape(spec["shape"]).copy()
    return arrays, meta


def _write_atomic(path: Path, head: bytes, blobs: list[np.ndarray] = ()) -> None:
    def write(f) -> None:
        f.write(head)
        for blob in blobs:
            f.write(blob.data)

    replace_atomically(path, write)


def remove_journal(directory: Path) -> None:
    """Remove a journal folder of ours: its records first, then the finished file, the marker and the lock last,
    so that a command killed on the way leaves a journal that still says what it is (``check_ours``) and, once
    the output is in place, that it was finished (``output.finished_before``)."""
    if directory.is_symlink():
        return
    last = (COMPLETE, MARKER, "lock")
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if entry.name in last:
                continue
            if entry.is_dir(follow_symlinks=False):
                remove_tree(Path(entry.path))
            else:
                remove(Path(entry.path))
    for name in last:
        with contextlib.suppress(OSError):
            remove(directory / name)
    remove_tree(directory)


def check_ours(directory: Path) -> None:
    """Refuse a journal path that holds something this program did not make (a link, a file, a
    folder without the marker)."""
    if directory.is_symlink() or not directory.is_dir():
        raise AvatarRenderError(
            f"{shown(directory)} is in the way of the render's resume journal and was not made by it; move it away.")
    marker = directory / MARKER
    if marker.is_symlink() or not marker.is_file():
        raise AvatarRenderError(f"The folder {shown(directory)} is in the way of the render's resume journal and was "
                                "not made by it; move it away.")


def _differences(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in list(old) + [k for k in new if k not in old]:
            out += _differences(old.get(key), new.get(key), f"{prefix}{key}" if not prefix else f"{prefix}.{key}")
        return out
    return [] if old == new else [(prefix, old, new)]
