"""Manifests: CSV with a header row, or JSON Lines, one job per row.

Columns (JSON keys): ``ref`` and ``audio`` (required), ``output`` (default: the audio's stem +
``.mp4``), ``overrides`` (config overrides: ``key=value`` separated by spaces in CSV, a list or a
mapping in JSON), ``prompt`` (the text prompt, ``model.prompt``), ``transcript`` (the words spoken: a text,
.srt or .vtt file, ``preview.transcript``). ``ref``, ``audio`` and ``transcript`` are resolved against the
manifest's folder, ``output`` against the batch's output folder, inside which it must stay
(no ``..`` out of it, no absolute path elsewhere). A bad row is refused with its line number before any
job runs.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
from pathlib import Path
from typing import Any

from avatar_render.batch.jobs import Job
from avatar_render.config import path_override
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown
from avatar_render.files.read import parse_json, read_text, regular_file
from avatar_render.files.render_paths import EXTRA_BYTES
from avatar_render.files.targets import TEMP_EXTRA, inside

MANIFEST_SUFFIXES = frozenset({".csv", ".jsonl", ".ndjson"})
COLUMNS = ("ref", "audio", "output", "overrides", "prompt", "transcript")
CELL_LIMIT = 64 << 10  # no path, override list or prompt is longer than this


def read_manifest(path: Path, *, out_dir: Path) -> tuple[Job, ...]:
    rows = _csv_rows(path) if path.suffix.lower() == ".csv" else _jsonl_rows(path)
    jobs: list[Job] = []
    seen: dict[Path, str] = {}
    for line, row in rows:
        where = f"{path.name} line {line}"
        job = _job(row, where=where, base=path.parent, out_dir=Path(out_dir))
        if job.output in seen:
            raise AvatarRenderError(
                f"{where}: its output '{job.output_name}' is already written by the job of {seen[job.output]}."
            )
        if job.output in (job.reference, job.audio):
            raise AvatarRenderError(f"{where}: its output is one of its inputs.")
        seen[job.output] = where
        jobs.append(job)
    if not jobs:
        raise AvatarRenderError(f"The manifest '{path}' holds no job.")
    return tuple(jobs)


def _read(path: Path) -> str:
    return read_text(path, what="manifest", give="a .csv or .jsonl file of jobs")


def _csv_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    # (strict: a quote left open ran to the end of the file as one cell, every row after it swallowed)
    reader = csv.DictReader(_read(path).splitlines(keepends=True), skipinitialspace=True, strict=True)
    try:
        return _csv_records(path, reader)
    except csv.Error as e:  # a cell over the csv module's field limit, a NUL byte in the file, a quote left open
        raise AvatarRenderError(f"{path.name} line {reader.line_num + 1}: not a readable CSV row ({e}).") from None


def _csv_records(path: Path, reader: csv.DictReader) -> list[tuple[int, dict[str, Any]]]:
    header = [name.strip().lower() for name in reader.fieldnames or ()]
    unknown = [name for name in header if name not in COLUMNS]
    if unknown or not {"ref", "audio"} <= set(header):
        raise AvatarRenderError(
            f"{path.name} line 1: the header must name the columns ref and audio (and may add "
            f"output, overrides, prompt, transcript); it has {', '.join(header) or 'none'}."
        )
    reader.fieldnames = header
    rows = []
    for row in reader:
        if None in row:  # more cells than columns
            raise AvatarRenderError(f"{path.name} line {reader.line_num}: more cells than the header has columns.")
        rows.append((reader.line_num, {k: (v or "").strip() for k, v in row.items() if v is not None and v.strip()}))
    return rows


def _jsonl_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for number, text in enumerate(_read(path).splitlines(), start=1):
        if not text.strip():
            continue
        row = parse_json(text, where=f"{path.name} line {number}")
        if not isinstance(row, dict):
            raise AvatarRenderError(f"{path.name} line {number}: a row must be a JSON object with ref and audio.")
        unknown = sorted(set(row) - set(COLUMNS))
        if unknown:
            raise AvatarRenderError(
                f"{path.name} line {number}: unknown key '{unknown[0]}' (known: {', '.join(COLUMNS)})."
            )
        rows.append((number, row))
    return rows


def _job(row: dict[str, Any], *, where: str, base: Path, out_dir: Path) -> Job:
    for key in COLUMNS:
        value = row.get(key)
        if isinstance(value, str) and (len(value) > CELL_LIMIT or "\0" in value):
            raise AvatarRenderError(f"{where}: the {key} cell is "
                                    f"{'longer than 64 KB' if len(value) > CELL_LIMIT else 'not text (a NUL byte)'}.")
    paths = {}
    for key, what in (("ref", "reference"), ("audio", "audio"), ("transcript", "transcript")):
        value = row.get(key)
        if key == "transcript" and not value:
            continue
        if value is not None and not isinstance(value, str):  # (a JSON number, list, ...)
            raise AvatarRenderError(f"{where}: the {key} is {json.dumps(value)[:40]}, not a file name (give it as a "
                                    "string).")
        if not value:
            raise AvatarRenderError(f"{where}: the {key} column is empty.")
        try:
            path = regular_file(base / value, what=what, give="a file that exists").resolve()
        except AvatarRenderError as e:  # said with the cell as written
            said = str(e).replace(f"The {what} {shown(base / value)}", f"the {what} {shown(value)}", 1)
            raise AvatarRenderError(f"{where}: {said}") from None
        except (OSError, RuntimeError):  # (RuntimeError: a link loop, before Python 3.13)
            raise AvatarRenderError(f"{where}: the {what} {shown(value)} cannot be resolved to a file.") from None
        paths[key] = path
    output = row.get("output") or f"{paths['audio'].stem}.mp4"
    if not isinstance(output, str) or Path(output).suffix.lower() != ".mp4":
        raise AvatarRenderError(f"{where}: the output {shown(output)} must be a file name ending in .mp4.")
    target = _output(output, where=where, out_dir=out_dir)
    overrides = _overrides(row.get("overrides"), where=where)
    if "transcript" in paths:  # (first: the row's own overrides may still set another)
        overrides = (path_override("preview.transcript", paths["transcript"]),) + overrides
    prompt = row.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise AvatarRenderError(f"{where}: the prompt must be text.")
        overrides += (f"model.prompt={json.dumps(prompt)}",)  # quoted: commas and colons stay text
    try:
        name = str(target.relative_to(out_dir.resolve()).with_suffix(""))
    except ValueError:  # an absolute output elsewhere
        name = str(target.with_suffix(""))
    return Job(
        name=name, reference=paths["ref"], audio=paths["audio"], output=target, overrides=overrides, origin=where
    )


def _output(output: str, *, where: str, out_dir: Path) -> Path:
    """The output's absolute path: inside ``out_dir``, every part of it a name the system can take."""
    too_long = next((part for part in Path(output).parts
                     if len(os.fsencode(part)) + EXTRA_BYTES + TEMP_EXTRA > 255), None)
    if too_long is not None:
        raise AvatarRenderError(f"{where}: the output {shown(output[:60] + '...')} has a name too long for a file "
                                "(with the names written beside it, at most about 230 bytes).")
    target = Path(os.path.abspath(out_dir / output))
    if not inside(target, out_dir):
        raise AvatarRenderError(f"{where}: the output {shown(output)} is outside the output folder {shown(out_dir)}; "
                                "give a path inside it.")
    try:
        return target.resolve()
    except (OSError, RuntimeError):
        raise AvatarRenderError(f"{where}: the output {shown(output)} cannot be resolved to a path.") from None


def _overrides(value: Any, *, where: str) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        try:
            items = shlex.split(value)
        except ValueError as e:
            raise AvatarRenderError(f"{where}: the overrides cannot be split into key=value items ({e}).") from None
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = value
    elif isinstance(value, dict):
        items = [f"{k}={json.dumps(v)}" for k, v in value.items()]
    else:
        raise AvatarRenderError(f"{where}: overrides must be key=value items (a list or a mapping in JSON).")
    bad = next((item for item in items if "=" not in item), None)
    if bad is not None:
        raise AvatarRenderError(f"{where}: the override '{bad}' is not of the form key=value.")
    return tuple(items)
