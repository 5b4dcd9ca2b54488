"""Output helpers shared by the commands: rich tables for people, JSON and CSV for programs."""
import csv
import json
import os
import sys



PIPE_WIDTH = 200      # lines written to a pipe or file, unless COLUMNS says otherwise
MIN_WIDTH = 20        # a narrower COLUMNS is taken as a mistake: tables would be only edges


def console():
    from rich.console import Console       # imported on first use: --json runs never pay for rich
    width = None if _isatty(sys.stdout) else _columns()
    if WIDE:
        width = 1 << 16                          # tables take what they need; the terminal may wrap
    return Console(width=width, soft_wrap=False, highlight=False, emoji=False)    # data: ":x:" stays ":x:"


def import_rich():
    """Import what console() and table() use, now: for a command about to arm signal handlers that
    raise (see Context.import_device_modules)."""
    import rich.cells, rich.console, rich.table  # noqa: F401,E401


def _isatty(stream):
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):                  # closed
        return False


def _columns():
    """COLUMNS where it is a sensible width, else PIPE_WIDTH (an empty, zero, negative or
    non-numeric value must not make every table vanish or the command fail)."""
    text = os.environ.get("COLUMNS", "").strip()
    return int(text) if text.isdigit() and int(text) >= MIN_WIDTH else PIPE_WIDTH


WIDE = False          # --wide: every column, however wide the terminal


def table(title, columns, rows, caption=None):
    """Columns: ">NAME" right-aligned, "~NAME" may wrap (long text), "-NAME" optional: dropped,
    rightmost first, when the table would not fit the terminal. No other column is ever cut: an
    identifier (a PID, a GPU id, a PCI address) is shown whole or the line runs past the edge."""
    return _FittedTable(title, columns, [["" if v is None else str(v) for v in row] for row in rows], caption)


class _FittedTable:
    """Built when rendered, for the width it gets (rich's own fitting crops cells silently)."""
    WRAPPED_MIN = 12                              # a wrapping column is not squeezed below this

    def __init__(self, title, columns, rows, caption):
        self.title, self.columns, self.rows, self.caption = title, columns, rows, caption

    def _natural(self, i):
        from rich.cells import cell_len
        name = self.columns[i].lstrip(">~-")
        return max([cell_len(name)] + [max(map(cell_len, row[i].split("\n"))) for row in self.rows])

    def __rich_console__(self, console, options):
        from rich.table import Table
        natural = [self._natural(i) for i in range(len(self.columns))]
        least = [min(w, self.WRAPPED_MIN) if c.startswith("~") else w for c, w in zip(self.columns, natural)]
        keep = list(range(len(self.columns)))

        def need():                                  # the narrowest table: cells, borders and padding
            return sum(least[i] + 3 for i in keep) + 1
        dropped = []
        if not WIDE:
            for i in reversed(range(len(self.columns))):
                if need() <= options.max_width:
                    break
                if self.columns[i].startswith("-"):
                    keep.remove(i)
                    dropped.insert(0, self.columns[i].lstrip("-"))
        caption = self.caption
        if dropped:
            note = f"not shown for this width: {', '.join(dropped)} (--wide shows every column)"
            caption = f"{caption}; {note}" if caption else note
        t = Table(title=self.title, caption=caption, show_lines=False, header_style="bold", title_justify="left")
        for i in keep:
            col = self.columns[i].lstrip("-")
            wraps = col.startswith("~")
            t.add_column(col.lstrip(">~"), justify="right" if col.startswith(">") else "left", no_wrap=not wraps,
                         overflow="fold", min_width=None if wraps else natural[i])
        for row in self.rows:
            t.add_row(*[row[i] for i in keep])
        if WIDE or need() > options.max_width:   # run past the edge rather than cut an identifier
            options = options.update(width=max(options.max_width, sum(natural[i] + 3 for i in keep) + 1))
        yield from console.render(t, options)


def print_json(obj):
    """Indented for a terminal; compact for pipes (json's C encoder: 10x faster at 1,000 processes)."""
    if sys.stdout.isatty():
        text = json.dumps(obj, indent=2, default=str)
    else:
        text = json.dumps(obj, separators=(",", ":"), default=str)
    sys.stdout.write(text + "\n")


def print_csv(header, rows):
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)


def human_bytes(n):
    if n is None:
        return None
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def group_identical(rows, id_column=0):
    """Merge rows that differ only in their id column: "24248 +31 more". Keeps first-seen order."""
    groups = {}
    for row in rows:
        key = tuple(v for i, v in enumerate(row) if i != id_column)
        groups.setdefault(key, []).append(row[id_column])
    out = []
    for key, ids in groups.items():
        label = str(ids[0]) if len(ids) == 1 else f"{ids[0]} +{len(ids) - 1} more"
        out.append(tuple(list(key[:id_column]) + [label] + list(key[id_column:])))
    return out
