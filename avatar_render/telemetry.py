"""Cheap, always-on measurements of a render: stage times, memory, per-chunk records."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from avatar_render.files.targets import signature
from avatar_render.files.write import replace_atomically, scratch_file

REPORT = "report"  # the kind of file a render's --report is (files.targets.signature)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_WORK: dict[str, int] = {}  # process-wide counts of work done, e.g. "dit_tokens" (see ``count``)


def count(name: str, amount: int) -> None:
    """Add ``amount`` to the process-wide count ``name`` (e.g. "dit_tokens": tokens through the DiT, one
    per token and pass). Each chunk record carries the counts since its telemetry began, so the work
    done before the first frame (or any frame) can be read off the report on any machine."""
    _WORK[name] = _WORK.get(name, 0) + int(amount)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE / 2**20
    except OSError:
        return peak_rss_mb()


def rss_mb_of(pid: int) -> float | None:
    """Resident memory of another process now (a benchmark watching a render), None once it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return None


def _cuda():
    """torch.cuda when this process already uses a GPU, else None (the preview engine never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def peak_gpu_mb() -> float | None:
    """Peak GPU memory allocated by this process so far (current device), or None without a GPU."""
    cuda = _cuda()
    return None if cuda is None else cuda.max_memory_allocated() / 2**20


class Telemetry:
    """Accumulates per-stage seconds; streams one record per published chunk to a spool file
    (so a ten-hour render keeps constant memory) that ``records()`` reads back at the end.

    On a GPU each stage ends with a synchronisation, so its time is its own kernels' and not the
    previous stage's queued work (about 10 us per stage call against seconds per chunk)."""

    def __init__(self, *, keep_records: bool) -> None:
        self.t0 = time.perf_counter()
        self.stage_seconds: dict[str, float] = {}
        self._chunk_stage: dict[str, float] = {}
        self._spool = scratch_file("w+") if keep_records else None
        self._work0 = dict(_WORK)

    def work(self) -> dict[str, int]:
        """The work counted (``count``) since this telemetry began."""
        return {k: v - self._work0.get(k, 0) for k, v in _WORK.items()}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            cuda = _cuda()
            if cuda is not None:  # this stage's stream only: the block streamer's copies may run on
                cuda.current_stream().synchronize()
            dt = time.perf_counter() - t
            self.stage_seconds[name] = self.stage_seconds.get(name, 0.0) + dt
            self._chunk_stage[name] = self._chunk_stage.get(name, 0.0) + dt

    def chunk_stamp(self) -> dict:
        """A chunk is done: when, the memory then and its stage times (the record's own fields)."""
        stamp = {} if self._spool is None else {
            "t_s": round(self.elapsed(), 4), "rss_mb": round(current_rss_mb(), 1),
            **({} if (gpu := peak_gpu_mb()) is None else {"peak_gpu_mb": round(gpu, 1)}),
            "stage_s": {k: round(v, 5) for k, v in self._chunk_stage.items()},
            **({"work": work} if (work := self.work()) else {})}
        self._chunk_stage = {}
        return stamp

    def chunk_done(self, stamp: dict | None = None, **fields: Any) -> None:
        """Record a chunk with ``fields``, stamped now or, given ``stamp``, when that was taken (the
        record may then be written from another thread, one at a time)."""
        stamp = self.chunk_stamp() if stamp is None else stamp
        if self._spool is not None:
            self._spool.write(json.dumps({**fields, **stamp}) + "\n")

    def records(self) -> Iterator[dict]:
        if self._spool is None:
            return
        self._spool.seek(0)
        for line in self._spool:
            yield json.loads(line)

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()


def write_report(path: Path, summary: dict, records: Iterator[dict]) -> None:
    """Write the JSON report without holding every chunk record in memory at once. Its first key says
    who wrote it, so that a later render replaces it without --force (and nobody else's file)."""
    def write(f) -> None:
        body = json.dumps({"written_by": signature(REPORT), **summary}, indent=2)
        f.write((body[:-2] + ',\n  "chunks": [').encode())
        for i, rec in enumerate(records):
            f.write((("," if i else "") + "\n    " + json.dumps(rec)).encode())
        f.write(b"\n  ]\n}\n")

    replace_atomically(Path(path), write)
