"""README numbers come from committed results: every table the README (and docs/*.md) marks with
`<!-- table: python scripts/X.py --table FILES [--OPTION] -->` is what that script prints for those files now."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARK = re.compile(r"<!-- table: python (scripts/\S+\.py) --table ([^>]+?) -->\n")


@pytest.mark.parametrize("document", ["README.md", "docs/measurements.md", "docs/simulation-log.md"])
def test_readme_tables_match_the_committed_results(document):
    readme = (REPO / document).read_text()
    marks = list(MARK.finditer(readme))
    assert marks, f"{document} has no generated table"
    for mark in marks:
        script, args = mark.group(1), mark.group(2).split()
        for f in (a for a in args if not a.startswith("--")):       # the rest: the script's options
            assert (REPO / f).is_file(), f"{f} is named by the README but not committed"
        printed = subprocess.run([sys.executable, str(REPO / script), "--table", *args], cwd=REPO,
                                 capture_output=True, text=True, check=True).stdout
        assert readme[mark.end():].startswith(printed), f"{document}: table after {mark.group(0)!r} differs from {script}'s"
