"""Console tables that fit the terminal: a table wider than the console is stacked (one block per row, its key
cells first, then ``column: value`` pairs wrapped at the console's width) instead of cut with "…"; and the one
legend line that tells the rows that look alike apart (``core/vocabulary.py``'s ``LOOK_ALIKE``)."""

from __future__ import annotations

import io
from typing import Iterable, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from loadgen.core.vocabulary import LOOK_ALIKE

EXPLAIN = "loadgen explain NAME"


def _plain(cell: object) -> str:
    """A cell as the console shows it (markup such as ``[red]FAIL`` read, not printed)."""
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell)).plain if isinstance(cell, str) else str(cell)


def needed_width(table: Table) -> int:
    """The columns the table takes when nothing in it is wrapped or cut (its columns are set no_wrap: a table that
    fits is printed whole, one line a row)."""
    wide = Console(width=10_000, file=io.StringIO(), record=True, color_system=None)
    for column in table.columns:
        column.no_wrap = True
    wide.print(table)
    return max((len(line.rstrip()) for line in wide.export_text().splitlines()), default=0)


def cells(table: Table) -> list[list[str]]:
    """The table's rows as plain text, in column order."""
    columns = [[_plain(c) for c in column.cells] for column in table.columns]
    return [list(row) for row in zip(*columns)]


def packed(pairs: list[str], width: int, indent: str = "  ") -> list[str]:
    """``pairs`` joined by " · " into lines of at most ``width``, a pair never split (one longer than the width
    alone on its line, folded by the console)."""
    lines: list[str] = []
    for pair in pairs:
        joined = f"{lines[-1]} · {pair}" if lines else ""
        if lines and len(joined) <= width:
            lines[-1] = joined
        else:
            lines.append(indent + pair)
    return lines


def stacked(table: Table, keys: Sequence[str] = (), width: int = 80) -> Group:
    """One block per row: the key cells on a line of their own (never cut), then ``header: value`` pairs."""
    headers = [_plain(c.header) for c in table.columns]
    key_at = [i for i, h in enumerate(headers) if h in keys] or [0]
    parts: list[RenderableType] = []
    if table.title:
        parts.append(Text(_plain(table.title), style="italic"))
    for row in cells(table):
        parts.append(Text("  ".join(row[i] for i in key_at), style="bold", overflow="fold"))
        pairs = [f"{headers[i]}: {row[i]}" for i in range(len(row)) if i not in key_at and row[i]]
        parts += [Text(line, overflow="fold") for line in packed(pairs, width)]
    return Group(*parts)


def fit(console: Console, table: Table, keys: Sequence[str] = ()) -> RenderableType:
    """The table as it is where the console is wide enough for all of it, else stacked (``stacked``): rich
    would otherwise shrink its columns and cut key cells (an objective's name, compare's status) with "…"."""
    if needed_width(table) <= console.width:
        return table
    return stacked(table, keys, console.width)


class Fitted:
    """A table fitted where it is printed (``fit`` at the width rich offers it): for code that returns tables
    for others to print (``advice_report.console_tables``)."""

    def __init__(self, table: Table, keys: Sequence[str] = ()) -> None:
        self.table, self.keys = table, keys

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        fits = needed_width(self.table) <= options.max_width
        yield self.table if fits else stacked(self.table, self.keys, options.max_width)


def legend(names: Iterable[str]) -> str | None:
    """The legend line for the look-alike rows among ``names`` (None when none is there)."""
    shown = set(names)
    pairs = [f"{a}: {wa} ({b}: {wb})" for a, wa, b, wb in LOOK_ALIKE if a in shown or b in shown]
    return " · ".join(pairs + [EXPLAIN]) if pairs else None


def print_legend(console: Console, names: Iterable[str]) -> None:
    line = legend(names)
    if line:
        console.print(line, style="dim", highlight=False, markup=False)
