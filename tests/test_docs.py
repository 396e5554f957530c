"""The documentation stays navigable: every relative link resolves, and the README stays a short manual."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from synthkd_dev import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")), REPO_ROOT / "benchmarks" / "README.md"]
README_MAX_LINES = 160

FENCED_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.MULTILINE)


def prose(markdown: str) -> str:
    """The text a reader clicks in: code blocks and inline code hold no links."""
    return INLINE_CODE.sub("", FENCED_BLOCK.sub("", markdown))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")


def anchors(markdown_file: Path) -> set[str]:
    return {anchor(h) for h in HEADING.findall(FENCED_BLOCK.sub("", markdown_file.read_text(encoding="utf-8")))}


def relative_links(doc: Path) -> list[str]:
    return [t for t in LINK.findall(prose(doc.read_text(encoding="utf-8"))) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    assert doc.is_file(), f"{doc} is missing"
    broken = []
    for target in relative_links(doc):
        path_part, _, fragment = target.partition("#")
        linked = (doc.parent / path_part).resolve() if path_part else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {linked.relative_to(REPO_ROOT)}")
    assert not broken, f"{doc.relative_to(REPO_ROOT)}: " + "; ".join(broken)


def test_readme_is_a_short_manual() -> None:
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the reference belongs in docs/"


def test_the_anchor_rule_matches_github() -> None:
    assert anchor("Configuration: resources and environment") == "configuration-resources-and-environment"
    assert anchor("Reading synth_kd_v1 in Megatron-Core") == "reading-synth_kd_v1-in-megatron-core"
    assert anchor("Where a token's mask comes from") == "where-a-tokens-mask-comes-from"
