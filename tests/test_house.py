"""The repository explains itself: no file in it cites a document that lives outside it."""

import re
import subprocess

from conftest import REPO

# documents that exist only beside a development checkout, never in a user's clone
OUTSIDE = re.compile(r"DESIGN\.md|shared/docs|\bseeds/\d")


def test_no_file_cites_a_document_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    cited = []
    for name in files:
        if name.endswith((".py", ".md", ".toml", ".cfg", ".ini", ".txt")) and \
                name != "tests/test_house.py":
            text = (REPO / name).read_text(encoding="utf-8", errors="replace")
            cited += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
                      for m in OUTSIDE.finditer(text)]
    assert not cited, "\n".join(cited)
