"""Tables that fit the width they are printed at (a terminal, or 80 columns in a pipe) without cutting a
word: columns narrowed down to their longest word, and when even that is too wide, one block of
``header: value`` lines per row."""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

_FOLDED = 16


def fitted(table: Table, console: Console) -> list[RenderableType]:
    """What to print for ``table`` at ``console``'s width: the table (its columns narrowed where needed), or
    its rows as blocks of lines, then its caption."""
    width = console.width
    cells = [[_plain(c) for c in column._cells] for column in table.columns]
    headers = [_plain(column.header) for column in table.columns]
    longest = [max(len(line) for text in (h, *col) for line in text.splitlines() or [""]) for h, col in
               zip(headers, cells)]
    shortest = [max(len(word) for text in (h, *col) for word in text.split() or [""]) for h, col in
                zip(headers, cells)]
    # a column that folds (long paths) may break its words, down to a width still worth reading
    shortest = [min(s, _FOLDED) if column.overflow == "fold" else s for s, column in zip(shortest, table.columns)]
    extra = table._extra_width + sum(table._get_padding_width(i) for i in range(len(table.columns)))
    if sum(longest) + extra <= width:
        return [table]
    if sum(shortest) + extra > width:
        return _blocks(table, headers, cells)
    widths = list(longest)
    while sum(widths) + extra > width:  # narrow the widest column that can still wrap, a column at a time
        i = max((j for j in range(len(widths)) if widths[j] > shortest[j]), key=lambda j: widths[j] - shortest[j])
        widths[i] -= 1
    for column, w in zip(table.columns, widths):
        column.width, column.overflow = w, "fold"
    return [table]


def _blocks(table: Table, headers: list[str], cells: list[list[str]]) -> list[RenderableType]:
    rows = len(cells[0]) if cells else 0
    key = max(len(h) for h in headers[1:]) + 2 if len(headers) > 1 else 0
    out: list[RenderableType] = []
    if table.title:
        out.append(Text(_plain(table.title), style="bold"))
    for r in range(rows):
        out.append(Text(f"{headers[0]}: {cells[0][r]}", style="bold"))
        for h, col in zip(headers[1:], cells[1:]):
            if col[r]:
                out.append(Text(f"  {(h + ':'):{key}}{' '.join(col[r].split())}"))
    if table.caption:
        out.append(Text(_plain(table.caption), style="dim"))
    return out


def _plain(cell: object) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell)).plain if cell is not None else ""
