"""Manifests: CSV with a header row, or JSON Lines, one job per row.

Columns (JSON keys): ``ref`` and ``audio`` (required), ``output`` (default: the audio's stem +
``.mp4``), ``overrides`` (config overrides: ``key=value`` separated by spaces in CSV, a list or a
mapping in JSON), ``prompt`` (the text prompt, ``model.prompt``). ``ref`` and ``audio`` are resolved
against the manifest's folder, ``output`` against the batch's output folder. A bad row is refused with
its line number before any job runs.
"""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path
from typing import Any

from avatar_render.batch.jobs import Job
from avatar_render.errors import AvatarRenderError

MANIFEST_SUFFIXES = frozenset({".csv", ".jsonl", ".ndjson"})
COLUMNS = ("ref", "audio", "output", "overrides", "prompt")


def read_manifest(path: Path, *, out_dir: Path) -> tuple[Job, ...]:
    rows = _csv_rows(path) if path.suffix.lower() == ".csv" else _jsonl_rows(path)
    jobs: list[Job] = []
    seen: dict[Path, str] = {}
    for line, row in rows:
        where = f"{path.name} line {line}"
        job = _job(row, where=where, base=path.parent, out_dir=Path(out_dir))
        if job.output in seen:
            raise AvatarRenderError(
                f"{where}: its output '{job.output.name}' is already written by the job of {seen[job.output]}."
            )
        if job.output in (job.reference, job.audio):
            raise AvatarRenderError(f"{where}: its output is one of its inputs.")
        seen[job.output] = where
        jobs.append(job)
    if not jobs:
        raise AvatarRenderError(f"The manifest '{path}' holds no job.")
    return tuple(jobs)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise AvatarRenderError(f"Cannot read the manifest '{path}': {getattr(e, 'strerror', None) or e}.") from None


def _csv_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(_read(path).splitlines(keepends=True), skipinitialspace=True)
    header = [name.strip().lower() for name in reader.fieldnames or ()]
    unknown = [name for name in header if name not in COLUMNS]
    if unknown or not {"ref", "audio"} <= set(header):
        raise AvatarRenderError(
            f"{path.name} line 1: the header must name the columns ref and audio (and may add "
            f"output, overrides, prompt); it has {', '.join(header) or 'none'}."
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
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise AvatarRenderError(f"{path.name} line {number}: not valid JSON ({e.msg}).") from None
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
    paths = {}
    for key, what in (("ref", "reference"), ("audio", "audio")):
        value = row.get(key)
        if not isinstance(value, str) or not value:
            raise AvatarRenderError(f"{where}: the {key} column is empty.")
        path = (base / value).resolve()
        if not path.is_file():
            raise AvatarRenderError(f"{where}: the {what} '{value}' does not exist.")
        paths[key] = path
    output = row.get("output") or f"{paths['audio'].stem}.mp4"
    if not isinstance(output, str) or Path(output).suffix.lower() != ".mp4":
        raise AvatarRenderError(f"{where}: the output '{output}' must be a file name ending in .mp4.")
    target = (out_dir / output).resolve()
    overrides = _overrides(row.get("overrides"), where=where)
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
