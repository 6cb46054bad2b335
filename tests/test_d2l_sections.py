"""The D2L section map and the glossary (docs/reference/*.csv), and every D2L citation of the
repository written with both numberings.

- docs/reference/d2l_sections.csv maps the English edition's sections (d2l.ai 1.0.3: 11.x
  attention, 10.x modern RNNs) to the Chinese edition's (zh.d2l.ai 2.0.0: 10.x, 9.x). The known
  values below are read from the two books' tables of contents.
- docs/reference/glossary.csv: every attnlab name in it exists (imported, its parameter in the
  signature, or the config key in conf/), every section in it is in the map.
- Every tracked *.py, *.md and *.yaml file cites "D2L 11.3.2.1 (zh 10.3.1)": each D2L 10.x or
  11.x number is followed (after a space or a line break) by its Chinese number from the map, or by
  "(no zh section)" where the Chinese edition has none; "D2L zh 10.2.4" names a section only
  the Chinese edition has.
"""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import gen_d2l  # noqa: E402 - docs/ is no package: its path is added just above

NUMBER = r"\d+\.\d+(?:\.\d+)*"
# a space, or a line break with the next line's indentation and comment mark
GAP = r"(?: |[ \t]*\n[ \t]*(?:#[ \t]*)?)"
# "D2L 11.3", then what follows it: "(zh 10.3)" or "(no zh section)"
CITATION = re.compile(r"\bD2L (?P<number>1[01]\.\d+(?:\.\d+)*)")
FOLLOW = re.compile(rf"{GAP}\((?:zh (?P<zh>{NUMBER})|(?P<none>no zh section))\)")
# a further number of the same citation: "D2L 11.4.3 (zh 10.4.3), 11.7.6 (zh 10.7.6)"
MORE = re.compile(rf"(?:,|{GAP}and){GAP}(?P<number>1[01]\.\d+(?:\.\d+)*)")
ZH_ONLY = re.compile(rf"\bD2L{GAP}zh (?P<zh>{NUMBER})")
SCANNED = (".py", ".md", ".yaml", ".yml")


def sections() -> list[dict[str, str]]:
    return gen_d2l.read(gen_d2l.SECTIONS, gen_d2l.SECTION_COLUMNS)


def glossary() -> list[dict[str, str]]:
    return gen_d2l.read(gen_d2l.GLOSSARY, gen_d2l.GLOSSARY_COLUMNS)


def english_map() -> dict[str, str]:
    return {r["english"]: r["chinese"] for r in sections() if r["english"]}


def expected_zh(number: str, mapping: dict[str, str]) -> str | None:
    """The Chinese number of an English one ("" where the Chinese edition has no section);
    None where neither it nor a section above it without a Chinese counterpart is mapped."""
    if number in mapping:
        return mapping[number]
    parts = number.split(".")
    for n in range(len(parts) - 1, 0, -1):  # 11.8.2: no zh section, since 11.8 has none
        if mapping.get(".".join(parts[:n])) == "":
            return ""
    return None


def citation_problems(text: str, mapping: dict[str, str], zh_numbers: set[str]) -> list[tuple[int, str]]:
    """(offset, message) of each bad number of the D2L citations of a text."""
    problems = []

    def check(number: str, start: int, end: int) -> int:
        want = expected_zh(number, mapping)
        got = FOLLOW.match(text, end)
        if want is None:
            problems.append(
                (start, f"D2L {number}: not in docs/reference/d2l_sections.csv (a section of D2L 1.0?)")
            )
        elif got is None:
            fix = f"D2L {number} (zh {want})" if want else f"D2L {number} (no zh section)"
            problems.append((start, f"D2L {number}: write it {fix}"))
        elif (got["zh"] or "") != want:
            fix = f"(zh {want})" if want else "(no zh section)"
            problems.append((start, f"D2L {number} {got.group(0).strip()}: the map says {fix}"))
        return got.end() if got else end

    for m in CITATION.finditer(text):
        end = check(m["number"], m.start(), m.end())
        while more := MORE.match(text, end):
            end = check(more["number"], more.start("number"), more.end())
    for m in ZH_ONLY.finditer(text):
        if m["zh"] not in zh_numbers:
            problems.append(
                (m.start(), f"D2L zh {m['zh']}: not a Chinese section of docs/reference/d2l_sections.csv")
            )
    return sorted(problems)


def citation_errors(text: str, mapping: dict[str, str], zh_numbers: set[str]) -> list[str]:
    """What is wrong with the D2L citations of one text: one message per bad number."""
    return [message for _, message in citation_problems(text, mapping, zh_numbers)]


def tracked_texts() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    paths = [ROOT / p for p in out.stdout.split("\0") if p.endswith(SCANNED)]
    # this file's own examples of wrong citations are the checker's test data
    return [p for p in paths if p.is_file() and p != Path(__file__).resolve()]


# --- the section map ------------------------------------------------------------------------


def test_the_section_map_parses_with_unique_well_formed_numbers():
    rows = sections()
    assert len(rows) >= 60
    english = [r["english"] for r in rows if r["english"]]
    assert len(english) == len(set(english)), "an English section is mapped twice"
    for r in rows:
        assert r["english"] or r["chinese"], f"an empty row: {r}"
        for number, title in ((r["english"], r["english_title"]), (r["chinese"], r["chinese_title"])):
            assert bool(number) == bool(title), f"a number without a title or a title without one: {r}"
            assert not number or re.fullmatch(r"\d+(?:\.\d+)*", number), f"not a section number: {number}"
        if r["english"] and r["chinese"]:
            # the Chinese edition numbers chapter 11 as 10 and chapter 10 as 9
            assert int(r["chinese"].split(".")[0]) == int(r["english"].split(".")[0]) - 1, r
        assert not r["chinese"] or r["note_zh"] or not r["note"], f"a note without its Chinese: {r}"


@pytest.mark.parametrize(
    ("english", "chinese", "chinese_title"),
    [
        ("11.3", "10.3", "注意力评分函数"),
        ("11.3.2.1", "10.3.1", "掩蔽softmax操作"),  # the subsections differ
        ("11.3.4", "10.3.2", "加性注意力"),
        ("11.3.3", "10.3.3", "缩放点积注意力"),
        ("11.3.2.2", "10.2.4.1", "批量矩阵乘法"),  # in the Nadaraya–Watson section of zh
        ("11.5.2", "10.5.2", "实现"),
        ("11.6.3", "10.6.3", "位置编码"),
        ("11.7.2", "10.7.2", "基于位置的前馈网络"),
        ("11.7.3", "10.7.3", "残差连接和层规范化"),
        ("10.1", "9.2", "长短期记忆网络（LSTM）"),  # GRU and LSTM swap places
        ("10.2", "9.1", "门控循环单元（GRU）"),
        ("10.5.4", "9.5.5", "训练模型"),  # zh has a vocabulary subsection (9.5.3) of its own
        ("10.7.8", "9.7.6", "预测序列的评估"),  # BLEU
        ("10.8.3", "9.8.3", "束搜索"),
        ("11.8", "", ""),  # Transformers for Vision: no Chinese section
    ],
)
def test_the_map_holds_the_books_numbers(english, chinese, chinese_title):
    row = next(r for r in sections() if r["english"] == english)
    assert (row["chinese"], row["chinese_title"]) == (chinese, chinese_title)


def test_the_pages_render_the_map_and_the_glossary_from_the_csvs():
    english = gen_d2l.sections_table(zh=False).splitlines()
    assert "| 11.3.2.1 | Masked Softmax Operation | 10.3.1 | 掩蔽softmax操作 |  |" in english
    assert len(english) == 2 + len(sections())
    chinese = gen_d2l.sections_table(zh=True).splitlines()
    assert chinese[2].startswith("| 9 | 现代循环神经网络 | 10 |")  # sorted by the Chinese number
    glossary_zh = gen_d2l.glossary_table(zh=True)
    assert (
        "| 掩蔽softmax操作 | masked softmax operation | `attnlab.models.masked_softmax` "
        "| 10.3.1（英文版 11.3.2.1） |" in glossary_zh
    )
    for page in gen_d2l.TABLES:
        filled = gen_d2l.fill(page, (ROOT / "docs" / page).read_text(encoding="utf-8"))
        assert "<!-- table:" not in filled and "|---|---|---|---|---|" in filled


def test_a_page_without_its_marker_is_an_error():
    with pytest.raises(ValueError, match="exactly one line"):
        gen_d2l.fill("reference/glossary.md", "# Glossary\n")


# --- the glossary ---------------------------------------------------------------------------


def _resolve(dotted: str):
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for name in parts[n:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def code_name_exists(entry: str, conf: Path = ROOT / "conf") -> bool:
    """``attnlab.x.Name``, ``attnlab.x.Name(param)``, ``attnlab.x.Class.attr`` (an attribute
    that ``__init__`` sets: ``self.attr``) or ``conf:group.key.path`` (a key of some
    conf/group/*.yaml)."""
    if entry.startswith("conf:"):
        group, *keys = entry.removeprefix("conf:").split(".")
        for path in sorted((conf / group).glob("*.yaml")):
            node = yaml.safe_load(path.read_text(encoding="utf-8"))
            for key in keys:
                node = node.get(key) if isinstance(node, dict) else None
            if node is not None or _has_null_key(path, keys):
                return True
        return False
    m = re.fullmatch(r"(?P<name>[\w.]+?)(?:\((?P<param>\w+)\))?", entry)
    if not m or not m["name"].startswith("attnlab."):
        return False
    try:
        obj = _resolve(m["name"])
    except AttributeError:
        owner, attr = m["name"].rsplit(".", 1)
        cls = _resolve(owner)
        return inspect.isclass(cls) and f"self.{attr}" in inspect.getsource(cls)
    if m["param"]:
        return m["param"] in inspect.signature(obj).parameters
    return True


def _has_null_key(path: Path, keys: list[str]) -> bool:
    node = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key in keys[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    return isinstance(node, dict) and keys[-1] in node


def test_the_glossary_parses_with_the_chinese_editions_core_terms():
    rows = glossary()
    terms = {r["chinese"]: r for r in rows}
    assert len(terms) == len(rows), "a Chinese term is listed twice"
    for term in (
        "查询",
        "键",
        "值",
        "注意力汇聚",
        "掩蔽softmax操作",
        "加性注意力",
        "缩放点积注意力",
        "多头注意力",
        "自注意力",
        "位置编码",
        "基于位置的前馈网络",
        "强制教学",
        "束搜索",
        "词元",
        "词表",
    ):
        assert term in terms, f"{term} is missing from the glossary"
    assert terms["掩蔽softmax操作"]["code"] == "attnlab.models.masked_softmax"
    assert terms["强制教学"]["english"] == "teacher forcing"  # zh's word for it, not 教师强制
    for r in rows:
        assert r["chinese"] and r["english"] and r["chinese_section"], r
        assert not r["note"] or r["note_zh"], f"a note without its Chinese: {r}"


def test_every_glossary_name_exists_in_the_code():
    missing = [
        f"{r['chinese']}: {entry}"
        for r in glossary()
        for entry in (e.strip() for e in r["code"].split(";"))
        if entry and not code_name_exists(entry)
    ]
    assert not missing, "glossary names not in src/ or conf/: " + "; ".join(missing)


def test_the_name_check_rejects_names_that_do_not_exist():
    assert code_name_exists("attnlab.models.masked_softmax(valid_lens)")
    assert code_name_exists("attnlab.models.DotProductAttention.attention_weights")
    assert code_name_exists("conf:model.decoding.beam_size")
    assert not code_name_exists("attnlab.models.masked_softmax(lengths)")
    assert not code_name_exists("attnlab.models.DotProductAttention.weights")
    assert not code_name_exists("conf:model.decoding.beam_width")
    assert not code_name_exists("torch.bmm")  # only attnlab's own names


def test_every_glossary_section_is_in_the_map():
    rows = sections()
    english = {r["english"] for r in rows if r["english"]}
    chinese = {r["chinese"] for r in rows if r["chinese"]}
    for r in glossary():
        assert not r["english_section"] or r["english_section"] in english, r
        assert r["chinese_section"] in chinese, r


# --- the citations --------------------------------------------------------------------------


def test_the_citation_check_reads_every_form():
    mapping = {"11.3": "10.3", "11.3.2.1": "10.3.1", "11.4.3": "10.4.3", "11.8": "", "10.7": "9.7"}
    zh = {"10.3", "10.3.1", "10.2.4"}
    good = (
        "D2L 11.3.2.1 (zh 10.3.1); D2L 11.4.3 (zh 10.4.3), 11.3 (zh 10.3) and 11.3.2.1 (zh 10.3.1); "
        "D2L 11.8 (no zh section), D2L 11.8.2 (no zh section); D2L zh 10.2.4; D2L eq. 11.3.7; D2L 8.5"
    )
    assert citation_errors(good, mapping, zh) == []
    wrapped = "(D2L 11.3.2.1\n    (zh 10.3.1)), and\n# D2L 11.4.3 (zh 10.4.3),\n# 11.3 (zh 10.3)"
    assert citation_errors(wrapped, mapping, zh) == []
    assert citation_errors("D2L 11.4.3 (zh 10.4.3),\n    11.3 and more", mapping, zh) == [
        "D2L 11.3: write it D2L 11.3 (zh 10.3)"
    ]
    assert citation_errors("D2L 11.3.2.1 masks", mapping, zh) == [
        "D2L 11.3.2.1: write it D2L 11.3.2.1 (zh 10.3.1)"
    ]
    assert citation_errors("D2L 11.3 (zh 11.3)", mapping, zh) == [
        "D2L 11.3 (zh 11.3): the map says (zh 10.3)"
    ]
    assert citation_errors("D2L 11.4.3 (zh 10.4.3), 11.3", mapping, zh) == [
        "D2L 11.3: write it D2L 11.3 (zh 10.3)"
    ]
    assert citation_errors("D2L 11.8", mapping, zh) == ["D2L 11.8: write it D2L 11.8 (no zh section)"]
    assert citation_errors("D2L 11.9.1 (zh 10.9.1)", mapping, zh) == [
        "D2L 11.9.1: not in docs/reference/d2l_sections.csv (a section of D2L 1.0?)"
    ]
    assert citation_errors("D2L 10.7's data", mapping, zh) == ["D2L 10.7: write it D2L 10.7 (zh 9.7)"]
    assert citation_errors("D2L zh 10.9", mapping, zh) == [
        "D2L zh 10.9: not a Chinese section of docs/reference/d2l_sections.csv"
    ]


def test_every_d2l_citation_gives_the_chinese_number_too():
    mapping = english_map()
    zh_numbers = {r["chinese"] for r in sections() if r["chinese"]}
    errors = []
    for path in tracked_texts():
        text = path.read_text(encoding="utf-8")
        for offset, message in citation_problems(text, mapping, zh_numbers):
            errors.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, offset) + 1}: {message}")
    assert not errors, f"{len(errors)} citations to fix:\n" + "\n".join(errors)
