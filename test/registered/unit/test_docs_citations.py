"""Every repo path a page cites exists, and every stored result is cited.

Pages: README.md and every docs/**/*.md (the results folders' READMEs included). Fenced code blocks
are left out (the README's "Run it yourself" block is run by its own integration test).

What counts as a citation (the rule, kept strict enough that renaming a results file fails here):

1. A markdown link or image target that is a relative path (not `http:`, `https:`, `mailto:` or a bare
   `#anchor`; an `#anchor` suffix is dropped): resolved against the page's folder.
2. In a results folder's README (docs/results/<topic>/README.md), every backticked token in the first
   cell of a table row (the `files` column of its files -> command table): resolved against that
   README's folder.
3. Any other backticked token (a backtick span split at whitespace; `NAME=value` keeps the value;
   trailing `,;:.)` dropped; `<...>` and `$...` placeholders skipped) containing a `/`, when
   - it starts with `docs/`, `scripts/`, `python/` or `test/`: resolved against the repo root;
   - it starts with `results/` or `../`, or its first part names an entry of the page's own folder
     (e.g. `kv_canary/...` beside a page): resolved against the page's folder;
   - its first part is a folder of the package `python/sglang_pd/` (`srt/`, `harness/`, `bench/`, ...)
     and it ends in a file extension (`.py`, `.c`, `.md`, ...) or a `/`: resolved against
     `python/sglang_pd/` (the pages name modules that way). `bench/report.ttft_split` (a function)
     is not a path.
   Other tokens (upstream SGLang's own paths such as `layers/attention/merge_state.py`, commands,
   URLs) are not checked.

A citation may use `{a,b}` (each alternative is a citation) and `*` (it must match at least one path).
Each must exist as a file or a folder. Python module paths are checked like any other: when modules
move, the pages must follow.

Coverage: every file under docs/results/ (its READMEs aside) is matched by a file citation (a folder
citation does not count) of some page, the topic README's table included.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "docs" / "results"
PACKAGE = ROOT / "python" / "sglang_pd"
REPO_ROOTS = ("docs/", "scripts/", "python/", "test/")
EXTENSIONS = {".py", ".c", ".h", ".md", ".json", ".jsonl", ".log", ".png", ".txt", ".gz", ".sh", ".diff", ".out",
              ".toml", ".yaml", ".yml", ".cfg"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SPAN = re.compile(r"`([^`]+)`")
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def expand_braces(token: str) -> list[str]:
    """`a/{b,c}.json` -> [`a/b.json`, `a/c.json`]; any number of brace groups, not nested."""
    parts = re.split(r"\{([^{}]*)\}", token)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(pick) for pick in itertools.product(*choices)]


def matches(base: Path, token: str) -> list[Path]:
    """The existing paths `token` names under `base` (glob when it holds `*`)."""
    found = []
    for one in expand_braces(token):
        one = one.rstrip("/") or "."
        if "*" in one:
            found += sorted(base.glob(one))
        elif (base / one).exists():
            found.append(base / one)
    return found


def clean(word: str) -> str | None:
    """A backticked word as a path candidate, or None."""
    if "=" in word and not word.startswith("="):
        word = word.split("=", 1)[1]
    word = word.rstrip(",;:.)").lstrip("(")
    if not word or "/" not in word or "://" in word or word.startswith(("/", "~", "$", "<")) or "<" in word:
        return None
    return word


def package_folders() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}


def citations(page: Path) -> list[tuple[Path, str, bool]]:
    """(base folder, token, is_file_citation_for_coverage) for every citation on `page`."""
    text = FENCE.sub("", page.read_text())  # a fenced block's backticks would pair with the text's
    folder = page.parent
    out = []
    for target in LINK.findall(text):
        if target.startswith(("http:", "https:", "mailto:", "#")):
            continue
        target = target.split("#", 1)[0]
        out.append((folder, target, not target.endswith("/")))
    is_results_readme = page.name == "README.md" and RESULTS in page.parents
    body = []
    for line in text.splitlines():
        cells = line.split("|")
        if is_results_readme and line.startswith("|") and len(cells) > 2 and not set(cells[1].strip()) <= set("-"):
            out += [(folder, word, True) for span in SPAN.findall(cells[1]) for word in span.split()]
            line = "|".join(cells[2:])
        body.append(line)
    package = package_folders()
    for span in SPAN.findall("\n".join(body)):
        for raw in span.split():
            word = clean(raw)
            if word is None:
                continue
            first = word.split("/", 1)[0]
            if word.startswith(REPO_ROOTS):
                out.append((ROOT, word, not word.endswith("/")))
            elif word.startswith(("results/", "../")) or (folder / first).exists() and first not in ("", "."):
                out.append((folder, word, not word.endswith("/")))
            elif first in package and (word.endswith("/") or Path(word).suffix in EXTENSIONS):
                out.append((PACKAGE, word, False))
    return out


def test_every_cited_repo_path_exists():
    missing = [f"{page.relative_to(ROOT)}: {token}" for page in pages() for base, token, _ in citations(page)
               if not matches(base, token)]
    assert not missing, "cited but not in the repo:\n" + "\n".join(missing)


def test_every_stored_result_is_cited():
    cited = {path.resolve() for page in pages() for base, token, is_file in citations(page) if is_file
             for path in matches(base, token)}
    stored = [p for p in RESULTS.rglob("*") if p.is_file() and p.name != "README.md"]
    uncited = sorted(str(p.relative_to(ROOT)) for p in stored if p.resolve() not in cited)
    assert not uncited, "stored under docs/results/ but cited by no page nor its folder's README:\n" + "\n".join(uncited)


def test_every_results_folder_has_a_readme():
    assert [d.name for d in RESULTS.iterdir() if d.is_dir() and not (d / "README.md").exists()] == []


def summary_lines(page: str) -> int | None:
    """Lines of the `**Summary.**` paragraph that opens a topic page (after its title), or None."""
    paragraphs = page.split("\n\n")
    if len(paragraphs) < 2 or not paragraphs[1].startswith("**Summary.**"):
        return None
    return len(paragraphs[1].splitlines())


def test_every_topic_page_opens_with_a_summary_of_at_most_ten_lines():
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages
    found = {p.name: summary_lines(p.read_text()) for p in pages}
    assert {n: c for n, c in found.items() if c is None or c > 10} == {}
    assert summary_lines("# t\n\n**Summary.** " + "x\n" * 11) == 11  # the count itself
