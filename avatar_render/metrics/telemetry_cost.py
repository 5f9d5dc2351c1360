"""What the always-on render telemetry costs, in percent of render time.

Two estimates of the same thing:

* end to end: the same render, in this process, with the real telemetry and with a stand-in whose
  stage clock, chunk records and report rows do nothing, alternated over several repeats (medians);
* bottom up: the number of telemetry calls one render makes, times the cost of each call measured
  in a tight loop, plus writing the per-chunk records into the report.

Run ``python -m avatar_render.metrics.telemetry_cost --help``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import avatar_render.api as api
from avatar_render.config import load_config
from avatar_render.files.write import temp_folder
from avatar_render.telemetry import Telemetry, write_report

_STAGE_LOOPS, _RECORD_LOOPS, _SETUP_LOOPS = 20_000, 5_000, 200


class _NullTelemetry(Telemetry):
    """Same interface, no measuring: the baseline."""

    def stage(self, name: str):
        return nullcontext()

    def chunk_stamp(self) -> dict:
        return {}

    def chunk_done(self, **fields) -> None:
        pass

    def records(self) -> Iterator[dict]:
        return iter(())


class _CountingTelemetry(Telemetry):
    stages = chunks = 0

    def stage(self, name: str):
        _CountingTelemetry.stages += 1
        return super().stage(name)

    def chunk_done(self, **fields) -> None:
        _CountingTelemetry.chunks += 1
        super().chunk_done(**fields)


@dataclass(frozen=True)
class TelemetryCost:
    frames: int
    repeats: int
    render_s_with: float  # median wall seconds of a render with telemetry
    render_s_without: float  # ... with the do-nothing stand-in
    end_to_end_pct: float  # (with - without) / without, wall time
    spread_pct: float  # (max - min) / median wall time of the renders without telemetry: the noise of end_to_end_pct
    cpu_s_with: float  # median CPU seconds (all threads) of a render with telemetry
    cpu_s_without: float
    end_to_end_cpu_pct: float  # (with - without) / without, CPU time: less disturbed by other processes
    cpu_spread_pct: float
    end_to_end_min_pct: float  # the same from the fastest render of each kind (least disturbed), wall time
    end_to_end_cpu_min_pct: float
    stage_calls: int  # per render
    chunk_records: int
    stage_call_us: float  # cost of one timed stage, microseconds
    chunk_record_us: float  # cost of one chunk record (memory reading, JSON line)
    setup_us: float  # creating and closing the telemetry (its spool file)
    report_rows_ms: float  # writing the chunk records into the report
    bottom_up_pct: float  # (calls x costs + report rows) / render time


def _render(reference: Path, speech: Path, overrides: tuple[str, ...], workdir: Path, *, report: bool,
            telemetry: type[Telemetry] = Telemetry) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads) of one render measured by ``telemetry``."""
    cfg = load_config(None, overrides)
    request = api.RenderRequest(reference=reference, audio=speech, output=workdir / "out.mp4", config=cfg, force=True,
                                report=workdir / "report.json" if report else None)
    t, c = time.perf_counter(), time.process_time()
    probe = telemetry(keep_records=report)  # created and closed inside the timing, as a render does its own
    try:
        api.render(request, telemetry=probe)
    finally:
        probe.close()
    return time.perf_counter() - t, time.process_time() - c


def _per_call_us(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def measure(reference: Path, speech: Path, *, repeats: int = 5, overrides: tuple[str, ...] = (),
            report: bool = True) -> TelemetryCost:
    with temp_folder() as work:
        _render(reference, speech, overrides, work, report=report)  # warm-up: imports, caches, the face detector
        with_t, without_t = [], []
        for i in range(repeats):
            order = (True, False) if i % 2 == 0 else (False, True)
            for real in order:
                (with_t if real else without_t).append(_render(reference, speech, overrides, work, report=report,
                                                               telemetry=Telemetry if real else _NullTelemetry))
        _CountingTelemetry.stages = _CountingTelemetry.chunks = 0
        _render(reference, speech, overrides, work, report=report, telemetry=_CountingTelemetry)
        frames = int(json.loads((work / "report.json").read_text())["frames"]) if report else 0
        probe = Telemetry(keep_records=report)
        stage_us = _per_call_us(lambda: _timed_stage(probe), _STAGE_LOOPS)
        record = dict(kind="N", index=3, start=150, end=200)
        chunk_us = _per_call_us(lambda: probe.chunk_done(**record), _RECORD_LOOPS)
        t = time.perf_counter()
        if report:
            write_report(work / "rows.json", {"frames": 0}, probe.records())
        rows_ms = (time.perf_counter() - t) * 1e3 * _CountingTelemetry.chunks / _RECORD_LOOPS
        probe.close()
        setup_us = _per_call_us(lambda: Telemetry(keep_records=report).close(), _SETUP_LOOPS)
    wall_with, wall_without = [w for w, _ in with_t], [w for w, _ in without_t]
    cpu_with, cpu_without = [c for _, c in with_t], [c for _, c in without_t]
    base, cpu_base = statistics.median(wall_without), statistics.median(cpu_without)
    spent = ((_CountingTelemetry.stages * stage_us + _CountingTelemetry.chunks * chunk_us + setup_us) / 1e6
             + rows_ms / 1e3)
    return TelemetryCost(
        frames=frames, repeats=repeats,
        render_s_with=round(statistics.median(wall_with), 4), render_s_without=round(base, 4),
        end_to_end_pct=round(100 * (statistics.median(wall_with) - base) / base, 3),
        spread_pct=round(100 * (max(wall_without) - min(wall_without)) / base, 2),
        cpu_s_with=round(statistics.median(cpu_with), 4), cpu_s_without=round(cpu_base, 4),
        end_to_end_cpu_pct=round(100 * (statistics.median(cpu_with) - cpu_base) / cpu_base, 3),
        cpu_spread_pct=round(100 * (max(cpu_without) - min(cpu_without)) / cpu_base, 2),
        end_to_end_min_pct=round(100 * (min(wall_with) - min(wall_without)) / min(wall_without), 3),
        end_to_end_cpu_min_pct=round(100 * (min(cpu_with) - min(cpu_without)) / min(cpu_without), 3),
        stage_calls=_CountingTelemetry.stages, chunk_records=_CountingTelemetry.chunks,
        stage_call_us=round(stage_us, 3), chunk_record_us=round(chunk_us, 2), setup_us=round(setup_us, 1),
        report_rows_ms=round(rows_ms, 3),
        bottom_up_pct=round(100 * spent / base, 4),
    )


def _timed_stage(telemetry: Telemetry) -> None:
    with telemetry.stage("decode"):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", type=Path, default=Path("examples/face.png"))
    parser.add_argument("--audio", type=Path, default=Path("examples/talk.wav"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-report", action="store_true", help="render without --report (no per-chunk records)")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args()
    cost = measure(args.ref, args.audio, repeats=args.repeats, overrides=tuple(args.overrides),
                   report=not args.no_report)
    for key, value in asdict(cost).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
