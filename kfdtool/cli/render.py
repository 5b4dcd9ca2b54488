"""Output helpers shared by the commands: rich tables for people, JSON and CSV for programs."""
import csv
import json
import os
import sys



def console():
    from rich.console import Console       # imported on first use: --json runs never pay for rich
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", 200))
    return Console(width=width, soft_wrap=False, highlight=False)


def table(title, columns, rows, caption=None):
    """Columns: ">NAME" right-aligned, "~NAME" may wrap (long text), else left-aligned."""
    from rich.table import Table
    t = Table(title=title, caption=caption, show_lines=False, header_style="bold", title_justify="left")
    for col in columns:
        t.add_column(col.lstrip(">~"), justify="right" if col.startswith(">") else "left",
                     no_wrap=not col.startswith("~"), overflow="fold")
    for row in rows:
        t.add_row(*["" if v is None else str(v) for v in row])
    return t


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
