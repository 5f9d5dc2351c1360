"""Jobs from a SOURCE: a folder (reference and audio paired by file stem, or one reference for every
audio; a transcript of the same stem is the job's ``preview.transcript``) or a manifest file (see ``manifest``)."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from avatar_render.batch.jobs import Job
from avatar_render.batch.manifest import MANIFEST_SUFFIXES, read_manifest
from avatar_render.config import path_override
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown
from avatar_render.files.read import regular_file
from avatar_render.files.targets import Inputs

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff"})
VIDEO_SUFFIXES = frozenset({".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi"})  # references (their first frame)
AUDIO_SUFFIXES = frozenset({".wav", ".flac", ".mp3", ".m4a", ".aac", ".ogg", ".opus"})
TRANSCRIPT_SUFFIXES = frozenset({".txt", ".srt", ".vtt"})  # the words of the audio of the same stem


@dataclass(frozen=True)
class JobList:
    jobs: tuple[Job, ...]
    unpaired: tuple[Path, ...] = ()  # media files of a folder that found no partner (listed, never guessed), and
    # a job's transcripts where it has more than one


def load_jobs(source: Path, *, out_dir: Path, ref: Optional[Path] = None) -> JobList:
    """The jobs of ``source``; no job's output may be any job's input (a reference or an audio file)."""
    listed = _listed(Path(source), out_dir=out_dir, ref=ref)
    inputs = Inputs({})
    for job in listed.jobs:
        inputs.add(f"reference of {job.origin}", job.reference)
        inputs.add(f"audio of {job.origin}", job.audio)
    for job in listed.jobs:
        inputs.check(job.output, what=f"output of {job.origin}")
    return listed


def _listed(source: Path, *, out_dir: Path, ref: Optional[Path]) -> JobList:
    try:
        exists, is_dir = os.path.exists(source), source.is_dir()
    except (OSError, ValueError):
        raise AvatarRenderError(f"The batch source {shown(source)} is not a valid path.") from None
    if not exists:
        raise AvatarRenderError(f"The batch source {shown(source)} does not exist; give a folder or a .csv/.jsonl "
                                "manifest.")
    if is_dir:
        return pair_folder(source, out_dir=out_dir, ref=ref)
    if ref is not None:
        raise AvatarRenderError(
            "--ref is for a folder of audio files; a manifest names each job's reference in its ref column."
        )
    if source.suffix.lower() not in MANIFEST_SUFFIXES:
        raise AvatarRenderError(
            f"The batch source '{source}' is neither a folder nor a manifest ({', '.join(sorted(MANIFEST_SUFFIXES))})."
        )
    return JobList(jobs=read_manifest(source, out_dir=out_dir))


def pair_folder(folder: Path, *, out_dir: Path, ref: Optional[Path] = None) -> JobList:
    """One job per stem with exactly one reference (image or video) and one audio file, or with ``ref``
    one job per audio file; a job's stem with one transcript (.txt, .srt or .vtt: the words spoken) renders with
    it as ``preview.transcript`` (with two, neither: both are listed). Outputs are ``OUT_DIR/STEM.mp4``.
    Subfolders and hidden files are not read; text files of no job's stem are left alone."""
    if Path(out_dir).resolve() == folder.resolve():
        raise AvatarRenderError(
            f"Give an output folder other than the source folder '{folder}' (its videos would be read as references)."
        )
    if ref is not None:
        regular_file(ref, what="reference", give="an image or video file", empty_ok=False)
    refs: dict[str, list[Path]] = defaultdict(list)
    audios: dict[str, list[Path]] = defaultdict(list)
    texts: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        suffix = path.suffix.lower()
        if suffix in AUDIO_SUFFIXES:
            audios[path.stem].append(path)
        elif suffix in IMAGE_SUFFIXES or suffix in VIDEO_SUFFIXES:
            refs[path.stem].append(path)
        elif suffix in TRANSCRIPT_SUFFIXES:
            texts[path.stem].append(path)
    jobs, unpaired = [], []
    for stem in sorted(set(refs) | set(audios)):
        ref_files, audio_files = refs.get(stem, []), audios.get(stem, [])
        if ref is not None:
            unpaired += [p for p in ref_files if p.resolve() != Path(ref).resolve()]
            pair = (Path(ref), audio_files[0]) if len(audio_files) == 1 else None
        else:
            pair = (ref_files[0], audio_files[0]) if len(ref_files) == 1 and len(audio_files) == 1 else None
        if pair is None:
            unpaired += audio_files if ref is not None else ref_files + audio_files
            continue
        words = texts.get(stem, [])
        if len(words) > 1:
            unpaired += words
        jobs.append(
            Job(
                name=stem,
                reference=pair[0].resolve(),
                audio=pair[1].resolve(),
                output=(Path(out_dir) / f"{stem}.mp4").resolve(),
                overrides=(path_override("preview.transcript", words[0].resolve()),) if len(words) == 1 else (),
                origin=f"folder '{folder.name}'",
            )
        )
    if not jobs:
        what = (
            "an audio file"
            if ref is not None
            else "a reference and an audio file of the same name (anna.png + anna.wav)"
        )
        raise AvatarRenderError(f"The folder '{folder}' holds no job: it needs {what}.")
    return JobList(jobs=tuple(jobs), unpaired=tuple(unpaired))
