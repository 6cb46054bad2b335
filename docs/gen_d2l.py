"""Fill the tables of the D2L section map and the glossary from their CSVs at build time.

docs/reference/d2l_sections.csv (English 1.0 section → Chinese 2.0.0 section) and
docs/reference/glossary.csv (术语 → term → attnlab's name) are the sources. Each of the four
pages (d2l-sections.md, d2l-sections.zh.md, glossary.md, glossary.zh.md) holds its prose and
one marker line ``<!-- table: NAME.csv -->``; mkdocs-gen-files replaces the marker with the
table in the built site (the files in docs/ keep the marker). Run it alone to print the four
pages: ``python docs/gen_d2l.py``.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REFERENCE = DOCS / "reference"
SECTIONS = REFERENCE / "d2l_sections.csv"
GLOSSARY = REFERENCE / "glossary.csv"
SECTION_COLUMNS = ["english", "chinese", "english_title", "chinese_title", "note", "note_zh"]
GLOSSARY_COLUMNS = ["chinese", "english", "code", "english_section", "chinese_section", "note", "note_zh"]
MARKER = re.compile(r"^<!-- table: (?P<name>[\w.]+\.csv) -->$", re.MULTILINE)


def read(path: Path, columns: list[str]) -> list[dict[str, str]]:
    """The rows of a CSV as dicts; ValueError when its header is not ``columns``."""
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != columns:
            raise ValueError(f"{path.name}: header {reader.fieldnames}, expected {columns}")
        return list(reader)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def code(entries: str) -> str:
    """``a; conf:model.x`` → ```a```, ```model.x``` (config keys without their ``conf:``)."""
    names = [e.strip().removeprefix("conf:") for e in entries.split(";") if e.strip()]
    return ", ".join(f"`{cell(n)}`" for n in names) or "—"


def sections_table(zh: bool) -> str:
    rows = read(SECTIONS, SECTION_COLUMNS)
    if zh:
        lines = ["| 中文版 | 标题 | 英文版 | 英文标题 | 说明 |", "|---|---|---|---|---|"]
        rows = sorted(rows, key=lambda r: [int(p) for p in r["chinese"].split(".")] if r["chinese"] else [99])
        for r in rows:
            lines.append(
                f"| {r['chinese'] or '—'} | {cell(r['chinese_title']) or '—'} | {r['english'] or '—'} "
                f"| {cell(r['english_title']) or '—'} | {cell(r['note_zh'])} |"
            )
    else:
        lines = ["| English 1.0 | title | Chinese 2.0 | 标题 | note |", "|---|---|---|---|---|"]
        rows = sorted(rows, key=lambda r: [int(p) for p in r["english"].split(".")] if r["english"] else [99])
        for r in rows:
            lines.append(
                f"| {r['english'] or '—'} | {cell(r['english_title']) or '—'} | {r['chinese'] or '—'} "
                f"| {cell(r['chinese_title']) or '—'} | {cell(r['note'])} |"
            )
    return "\n".join(lines) + "\n"


def glossary_table(zh: bool) -> str:
    rows = read(GLOSSARY, GLOSSARY_COLUMNS)
    if zh:
        lines = ["| 术语 | 英文 | attnlab 中的名字 | 章节 | 说明 |", "|---|---|---|---|---|"]
        for r in rows:
            where = r["chinese_section"] + (
                f"（英文版 {r['english_section']}）" if r["english_section"] else ""
            )
            names = code(r["code"])
            lines.append(
                f"| {r['chinese']} | {cell(r['english'])} | {names} | {where} | {cell(r['note_zh'])} |"
            )
    else:
        lines = ["| English | 中文 | attnlab | D2L | note |", "|---|---|---|---|---|"]
        for r in rows:
            where = (r["english_section"] or "—") + f" (zh {r['chinese_section']})"
            lines.append(
                f"| {cell(r['english'])} | {r['chinese']} | {code(r['code'])} | {where} | {cell(r['note'])} |"
            )
    return "\n".join(lines) + "\n"


TABLES = {
    "reference/d2l-sections.md": lambda: sections_table(zh=False),
    "reference/d2l-sections.zh.md": lambda: sections_table(zh=True),
    "reference/glossary.md": lambda: glossary_table(zh=False),
    "reference/glossary.zh.md": lambda: glossary_table(zh=True),
}


def fill(page: str, text: str) -> str:
    """``text`` with its one marker replaced by the page's table; ValueError without one."""
    if len(MARKER.findall(text)) != 1:
        raise ValueError(f"{page}: needs exactly one line <!-- table: NAME.csv -->")
    return MARKER.sub(lambda _: TABLES[page]().rstrip("\n"), text)


def write() -> None:
    import mkdocs_gen_files

    for page in TABLES:
        with mkdocs_gen_files.open(page, "r") as f:
            text = f.read()
        with mkdocs_gen_files.open(page, "w") as f:
            f.write(fill(page, text))


if __name__ == "__main__":  # by hand: print the pages
    for page in TABLES:
        print(fill(page, (DOCS / page).read_text(encoding="utf-8")))
elif __name__ == "<run_path>":  # mkdocs-gen-files runs its scripts with runpy.run_path
    write()
