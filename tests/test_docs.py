"""The documentation's examples run, and its links lead somewhere."""

import os
import re

import pytest
from conftest import launch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
QUICKSTART = os.path.join(ROOT, "examples", "quickstart.py")


def test_readme_example_is_the_quickstart():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    with open(QUICKSTART) as f:
        example = f.read()
    assert f"```python\n{example}```" in readme, "README's first program differs from examples/quickstart.py"
    assert len(example.splitlines()) <= 25


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_quickstart_runs(ranks):
    out = launch(ranks, [QUICKSTART], timeout=120)
    size = 5 * ranks
    total = size * (size - 1) // 2 + (ranks if ranks > 1 else 0)
    assert f"{ranks} ranks on 1 node(s): sum {total}" in out, out


def _pages():
    yield os.path.join(ROOT, "README.md")
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        if "_build" not in folder:
            yield from (os.path.join(folder, f) for f in files if f.endswith(".md"))


@pytest.mark.parametrize("page", sorted(os.path.relpath(p, ROOT) for p in _pages()))
def test_relative_links_exist(page):
    with open(os.path.join(ROOT, page)) as f:
        text = f.read()
    missing = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
               if "://" not in t and not os.path.exists(os.path.join(ROOT, os.path.dirname(page), t))]
    assert not missing, f"{page} links to missing files: {missing}"
