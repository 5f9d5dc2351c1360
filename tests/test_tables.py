"""Tables readable at 80 columns and in a pipe: no cell cut short, whatever the width."""

import io

from rich import box
from rich.console import Console
from rich.table import Column, Table

from avatar_render.tables import fitted

HEADERS = ("backend", "audio", "size", "frames", "load", "1st frame", "1st sampled", "fps", "x real", "peak MB",
           "MB chunk 1/last")
ROW = ("infinitetalk", "600 s", "1280x720", "15000", "12.50 s", "0.21 s [4096]", "3.10 s [81920]", "184", "7.36",
       "280", "201 / 204")


def shown(table: Table, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), force_terminal=False)
    for part in fitted(table, console):
        console.print(part)
    return console.file.getvalue()


def bench_like() -> Table:
    table = Table(*HEADERS, box=box.SIMPLE_HEAD, caption="fps: generated frames per second")
    table.add_row(*ROW)
    table.add_row(*ROW)
    return table


def test_a_wide_table_at_80_columns_becomes_blocks_with_every_cell_whole():
    text = shown(bench_like(), 80)
    assert "…" not in text and "..." not in text
    assert max(map(len, text.splitlines())) <= 80
    lines = text.splitlines()
    assert lines.count("backend: infinitetalk") == 2
    for header, cell in zip(HEADERS[1:], ROW[1:]):
        assert sum(" ".join(line.split()) == f"{header}: {cell}" for line in lines) == 2, (header, cell)
    assert "fps: generated frames per second" in text


def test_a_table_that_fits_is_left_as_it_is():
    text = shown(bench_like(), 200)
    assert " ".join(HEADERS[:4]) in " ".join(text.split()) and "…" not in text


def test_a_long_detail_column_is_wrapped_at_words_never_cut():
    table = Table("metric", "value", "detail")
    detail = "correlation of mouth movement with speech level; best 0.68 at a lag of +0 frames (the mouth follows)"
    table.add_row("mouth vs speech", "0.68", detail)
    text = shown(table, 60)
    assert "…" not in text and max(map(len, text.splitlines())) <= 60
    assert "mouth vs speech" in text  # the short columns keep their width
    words = [w for line in text.splitlines() for w in line.replace("│", " ").split()]
    assert " ".join(detail.split()) in " ".join(words)


def test_a_folding_column_may_break_a_long_path():
    table = Table("item", "ok", Column("detail", overflow="fold"))
    path = "/a/very/long/path/that/is/longer/than/any/column/could/be/in/eighty/columns/face_landmark.tflite"
    table.add_row("face landmarks", "yes", f"MediaPipe: {path}")
    text = shown(table, 80)
    assert "│" in text and "…" not in text  # still a table
    assert path in "".join(line.split("│")[3].strip() for line in text.splitlines() if line.count("│") == 4)
