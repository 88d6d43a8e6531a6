"""The documents stay in step with the code.

- Every module ``docs/architecture.md`` names exists: a dotted module path (``pipeline.audit``,
  also with a class or function after it, ``pipeline.runner.PipelineRunner.ingest``) or a
  file path (``pipeline/audit.py``, ``joins/theta/adsp/``), in an inline code span or in a
  fenced block (its diagrams). A name after the module must be defined in it (for a class,
  also the attribute after that).
- Every Python file README.md and docs/*.md name as a path exists.
- Every relative link in README.md and docs/*.md points at a file that exists and, with a
  ``#fragment``, at a heading of that file; every page in docs/ is reachable from README.md.

Read from the text alone (no imports of the project, no Spark), so this runs in a second.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"

# The project's top-level packages (``dags`` is Airflow's DAG folder: files, not a package).
PACKAGES = (
    "benchmarks",
    "common",
    "dags",
    "demo",
    "jobs",
    "joins",
    "orchestration",
    "pipeline",
    "quality",
    "reports",
    "tests",
    "warehouse",
)
# Other top-level folders the documents name paths in.
FOLDERS = ("configs", "deps", "docker", "expectations")

_ROOTS = "|".join(PACKAGES)
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# Not preceded by a character of a path or a dotted name: ``configs/demo.yaml`` names no
# module ``demo.yaml``, ``enrich_demo`` no package ``demo``.
_START = r"(?<![\w./-])"
DOTTED = re.compile(rf"{_START}(?:{_ROOTS})(?:\.{_IDENT})+")
PATH = re.compile(rf"{_START}(?:{'|'.join((*PACKAGES, *FOLDERS))})/[\w./-]*")
# A path that continues with a placeholder or a glob (``silver/<table>``,
# ``pipeline/templates/*.py.j2``) names no one file.
PLACEHOLDER = re.compile(r"[<*{$]")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?([^\s>]+)>?", re.MULTILINE)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


# ---------------------------------------------------------------------- reading markdown


def code_texts(text: str) -> Iterator[str]:
    """The code of a markdown text: each fenced block, then each inline code span."""
    for block in FENCE.finditer(text):
        yield block.group(0)
    for span in INLINE_CODE.finditer(FENCE.sub("", text)):
        yield span.group(1)


def prose(text: str) -> str:
    """``text`` without its fenced blocks and inline code (no link is written there)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def named_modules(text: str) -> set[str]:
    """Dotted module paths and file paths of the project named in the code of ``text``."""
    found: set[str] = set()
    for code in code_texts(text):
        found.update(match.group(0).rstrip(".") for match in DOTTED.finditer(code))
        for match in PATH.finditer(code):
            if not PLACEHOLDER.match(code, match.end()):
                found.add(match.group(0).rstrip("."))
    return found


def named_python_files(text: str) -> set[str]:
    """File paths of Python files named in the code of ``text``."""
    return {name for name in named_modules(text) if "/" in name and name.endswith(".py")}


def relative_links(text: str) -> set[str]:
    """The link targets of ``text`` that are neither URLs nor e-mail addresses."""
    body = prose(text)
    targets = {m.group(1) for m in LINK.finditer(body)}
    targets |= {m.group(1) for m in REFERENCE.finditer(body)}
    return {t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)}


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    """The anchors of ``markdown``'s headings (GitHub numbers repeated ones: ``-1``, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", markdown.read_text())):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


# ---------------------------------------------------------------------- checking names


def _defined(tree: ast.Module | ast.ClassDef) -> set[str]:
    """The names a module or a class body defines: functions, classes, assignments and
    (a module's) imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _module(parts: list[str], root: Path) -> Path | None:
    """The file (or, for a folder without ``__init__.py``, the folder) of module ``parts``."""
    path = root.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path if path.is_dir() else None


def module_exists(dotted: str, root: Path = ROOT) -> bool:
    """Whether ``dotted`` is a module of the project, or a name defined in one (for a class,
    with the attribute after it)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        found = _module(parts[:cut], root)
        if found is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        if found.is_dir():
            return False  # a folder of modules defines no names
        tree = ast.parse(found.read_text(), str(found))
        if rest[0] not in _defined(tree):
            return False
        if len(rest) == 1:
            return True
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == rest[0]]
        # An attribute of a class must be in its body; of anything else it is not checked.
        return not classes or rest[1] in _defined(classes[0])
    return False


def path_exists(path: str, root: Path = ROOT) -> bool:
    return (root / path).exists()


def missing_names(text: str, root: Path = ROOT) -> list[str]:
    """The modules and files ``text`` names that do not exist under ``root``."""
    return sorted(
        name
        for name in named_modules(text)
        if not (path_exists(name, root) if "/" in name else module_exists(name, root))
    )


def broken_links(markdown: Path) -> list[str]:
    """The relative links of ``markdown`` whose file or heading does not exist."""
    broken = []
    for target in sorted(relative_links(markdown.read_text())):
        location, _, fragment = target.partition("#")
        resolved = (markdown.parent / location).resolve() if location else markdown
        if not resolved.exists():
            broken.append(f"{target}: no file {resolved}")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.name}")
    return broken


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


# ---------------------------------------------------------------------- the tests


def test_the_package_list_names_every_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} | {"dags"}
    assert packages == set(PACKAGES)


def test_architecture_names_only_modules_that_exist() -> None:
    text = ARCHITECTURE.read_text()
    named = named_modules(text)
    # The page names the modules of every layer: far fewer means the parsing broke.
    assert len(named) > 60, sorted(named)
    assert {p.split("/")[0].split(".")[0] for p in named} >= set(PACKAGES) - {"tests"}
    assert missing_names(text) == []


def test_python_files_named_in_the_documents_exist() -> None:
    missing = {
        page.name: sorted(p for p in named_python_files(page.read_text()) if not path_exists(p))
        for page in pages()
    }
    assert {page: paths for page, paths in missing.items() if paths} == {}


def test_relative_links_point_at_files_and_headings_that_exist() -> None:
    assert relative_links(README.read_text()), "README.md links to no document"
    broken = {page.name: broken_links(page) for page in pages()}
    assert {page: links for page, links in broken.items() if links} == {}


def test_every_document_is_reachable_from_the_readme() -> None:
    reached, todo = {README.resolve()}, [README.resolve()]
    while todo:
        page = todo.pop()
        for target in relative_links(page.read_text()):
            found = (page.parent / target.partition("#")[0]).resolve()
            if found.suffix == ".md" and found.is_file() and found not in reached:
                reached.add(found)
                todo.append(found)
    assert {p.resolve() for p in DOCS.glob("*.md")} - reached == set()


def test_the_checks_catch_a_missing_module_a_missing_name_and_a_broken_link(
    tmp_path: Path,
) -> None:
    (tmp_path / "pipeline" / "ssbj").mkdir(parents=True)
    (tmp_path / "pipeline" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "ssbj" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "ssbj" / "stage.py").write_text(
        "class SsbjStage:\n    def run(self) -> None: ...\n\ndef helper() -> None: ...\n"
    )
    text = (
        "`pipeline.ssbj.stage` `pipeline.ssbj.stage.SsbjStage.run` `pipeline/ssbj/stage.py`\n"
        "```\npipeline.ssbj.stage.helper -> pipeline.ssbj.planning\n"
        "silver/<table> configs/demo.yaml pipeline/templates/*.py.j2\n```\n"
        "`pipeline.ssbj.stage.SsbjStage.step` `pipeline.ssbj.stage.nothing` "
        "`pipeline/ssbj/commit.py` `pipeline/ssbj/`\n"
    )
    assert missing_names(text, tmp_path) == [
        "configs/demo.yaml",
        "pipeline.ssbj.planning",
        "pipeline.ssbj.stage.SsbjStage.step",
        "pipeline.ssbj.stage.nothing",
        "pipeline/ssbj/commit.py",
    ]
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## The `enrich` command\n")
    page.write_text(
        "[a](other.md#the-enrich-command) [b](other.md#nowhere) [c](gone.md) "
        "[d](https://example.com/x.md) `[e](inside-code.md)`\n\n[f]: other.md#other-page\n"
    )
    assert broken_links(page) == [
        f"gone.md: no file {tmp_path / 'gone.md'}",
        "other.md#nowhere: no heading #nowhere in other.md",
    ]
