"""README numbers come from committed results: every table the README marks with
`<!-- table: python scripts/X.py --table FILES -->` is what that script prints for those files now."""
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = re.compile(r"<!-- table: python (scripts/\S+\.py) --table ([^>]+?) -->\n")


def test_readme_tables_match_the_committed_results():
    readme = (REPO / "README.md").read_text()
    marks = list(MARK.finditer(readme))
    assert marks, "the README has no generated table"
    for mark in marks:
        script, files = mark.group(1), mark.group(2).split()
        for f in files:
            assert (REPO / f).is_file(), f"{f} is named by the README but not committed"
        printed = subprocess.run([sys.executable, str(REPO / script), "--table", *files], cwd=REPO,
                                 capture_output=True, text=True, check=True).stdout
        assert readme[mark.end():].startswith(printed), f"README table after {mark.group(0)!r} differs from {script}'s"
