"""Tables that fit the terminal they are drawn in (docs/monitoring.md, "Tables at any width").

Rich wraps every cell to make a table fit, so `335.39 ± 4.80` becomes `335.3` / `9 ±` / `4.80`
and a host name `127.0.0…`. A FitTable is a Rich Table whose columns say how they may give way:
a WHOLE column (numbers, host names, run ids, every header) is never wrapped or cut, a WORDS
column wraps only between words (a list of hosts), a TEXT column (an error, a fix) anywhere.
Drawn narrower than its natural width, the columns its `folds` name drop in that order until
the rest fit, and a dim line names them; below RECORD_WIDTH, or when even the
columns that never drop do not fit, each row is printed as a record, one `header  value` line
per column. A table without headers (a `field  value` list, `agent temp`) is one record
already: it keeps its table form below RECORD_WIDTH while its columns fit. Sized at draw time,
so one table serves a terminal, a pipe and a test's Console.
Pure: Rich only.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

Wrap = Literal["whole", "words", "text"]
WHOLE: Wrap = "whole"
WORDS: Wrap = "words"
TEXT: Wrap = "text"
RECORD_WIDTH = 60
"""Below this many columns a table prints one record per row instead."""
TEXT_MIN = 12
"""The fewest cells a TEXT column is given (or its natural width when smaller): less is
slivers."""
NATURAL = 100_000
"""A width no table reaches, to measure one unwrapped."""


class FitTable(Table):
    """A Table whose columns fold away, in its `folds` order, to fit the width it is drawn
    in; every other use of a Table (columns, rows, caption, row_count) is Rich's."""

    def __init__(self, *args: Any, folds: Sequence[str] = (), **kwargs: Any) -> None:
        """`folds`: the headers of the columns that may drop, the first to drop first."""
        super().__init__(*args, **kwargs)
        self.fold_order = tuple(folds)
        self.wraps: list[Wrap] = []

    def add_column(  # type: ignore[override]
        self,
        header: str = "",
        *,
        wrap: Wrap = WHOLE,
        justify: Literal["left", "right"] = "left",
        **kwargs: Any,
    ) -> None:
        """A column that is `wrap` (WHOLE: never wrapped); it may drop if `folds` names it."""
        super().add_column(
            header, justify=justify, no_wrap=wrap == WHOLE, overflow="fold", **kwargs
        )
        self.wraps.append(wrap)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        natural = Table.__rich_measure__(self, console, options.update_width(NATURAL)).maximum
        if natural <= width or not self.columns:
            yield from Table.__rich_console__(self, console, options)
            return
        ranges = [self._range(console, options, index) for index in range(len(self.columns))]
        shown = self._kept([least for least, _ in ranges], width)
        if (width < RECORD_WIDTH and self.show_header) or shown is None:
            yield from self._records()
            return
        widths = self._widths(shown, ranges, width)
        narrow = copy.copy(self)
        narrow.columns = [
            replace(self.columns[index], _index=at, width=widths[index])
            for at, index in enumerate(shown)
        ]
        yield from Table.__rich_console__(narrow, console, options)
        folded = [self._header(index) for index in range(len(self.columns)) if index not in shown]
        if folded:
            yield Text(f"not shown at {width} columns: {', '.join(folded)}", style="dim")

    def _header(self, index: int) -> str:
        header = self.columns[index].header
        return header.plain if isinstance(header, Text) else str(header)

    def _range(self, console: Console, options: ConsoleOptions, index: int) -> tuple[int, int]:
        """(the fewest cells column `index` can have, its natural width). The fewest: all of a
        WHOLE column, the longest word of a WORDS one, TEXT_MIN (or less, if all fits) of a TEXT
        one; never less than its header."""
        wide = options.update_width(NATURAL)
        column = self.columns[index]
        cells = [column.header, *column.cells] if self.show_header else list(column.cells)
        sizes = [Measurement.get(console, wide, cell) for cell in cells]
        natural = max((size.maximum for size in sizes), default=0)
        header = Measurement.get(console, wide, column.header).maximum
        if self.wraps[index] == WHOLE:
            return natural, natural
        if self.wraps[index] == WORDS:
            return max([header, *(size.minimum for size in sizes)]), natural
        return max(header, min(natural, TEXT_MIN)), natural

    def _frame(self, count: int) -> int:
        """The cells a table of `count` columns spends on padding and rules."""
        _, right, _, left = self.padding
        rules = (count + 1 if self.show_edge else count - 1) if self.box else 0
        return count * (left + right) + rules

    def _kept(self, least: list[int], width: int) -> list[int] | None:
        """The columns left once those `folds` names have dropped, in its order, until the rest
        fit in `width`; None when even those that never drop do not."""
        shown = list(range(len(self.columns)))
        headers = [self._header(index) for index in shown]
        dropping = [headers.index(name) for name in self.fold_order if name in headers]
        for index in [None, *dropping]:
            if index is not None:
                shown.remove(index)
            if sum(least[i] for i in shown) + self._frame(len(shown)) <= width:
                return shown
        return None

    def _widths(
        self, shown: list[int], ranges: list[tuple[int, int]], width: int
    ) -> dict[int, int]:
        """Each shown column's width: its least, then what room is left shared among those
        that want more (the narrowest wants met first), so none is wrapped more than it must."""
        widths = {index: ranges[index][0] for index in shown}
        spare = width - sum(widths.values()) - self._frame(len(shown))
        wanting = sorted((i for i in shown if ranges[i][1] > widths[i]), key=lambda i: ranges[i][1])
        for left, index in zip(range(len(wanting), 0, -1), wanting, strict=True):
            grant = min(ranges[index][1] - widths[index], spare // left)
            widths[index] += grant
            spare -= grant
        return widths

    def _records(self) -> RenderResult:
        """Each row as `header  value` lines, a blank line between rows: a terminal too narrow
        for any table still shows every figure whole."""
        if self.title:
            yield _as_text(self.title, "table.title")
        headers = [self._header(index) for index in range(len(self.columns))]
        cells = [list(column.cells) for column in self.columns]
        for number, row in enumerate(self.rows):
            record = Table.grid(padding=(0, 1))
            record.add_column(style="bold", no_wrap=True)
            record.add_column(overflow="fold")
            for header, column in zip(headers, cells, strict=True):
                record.add_row(header, column[number], style=row.style)
            yield record
            if number < len(self.rows) - 1:
                yield Text("")
        if self.caption:
            yield _as_text(self.caption, "table.caption")


def _as_text(text: str | Text, style: str) -> Text:
    """A title or caption as a record layout prints it: a string as it is, never markup."""
    return Text(text, style=style) if isinstance(text, str) else text
