"""The README and docs/ pages: the README opens with the two commands, and every relative link
resolves to a file of the repository (and, with an anchor, to a heading of that page).

The commands in their bash blocks run in tests/cli/test_cli_examples.py.
"""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target) and ![alt](target), outside code spans and blocks
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The page less its code blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercased, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not this test's business
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no {resolved})")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target} (no heading #{fragment} in {resolved.name})")
    return broken


def test_every_relative_link_resolves():
    broken = {str(page.relative_to(REPO)): b for page in PAGES if (b := broken_links(page))}
    assert not broken, broken


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](page.md#title) [gone](missing.md) [no anchor](#nowhere) `[code](x.md)`\n")
    assert broken_links(page) == [f"missing.md (no {tmp_path / 'missing.md'})", "#nowhere (no heading #nowhere in page.md)"]


def test_readme_opens_with_the_two_commands():
    first_block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["./dev demo", "./dev test"], commands


def test_every_docs_page_is_in_the_index():
    index = (REPO / "docs" / "README.md").read_text()
    missing = [p.name for p in PAGES if p.parent.name == "docs" and p.name != "README.md" and f"]({p.name})" not in index]
    assert not missing, f"docs pages the index docs/README.md does not link: {missing}"
