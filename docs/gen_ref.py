"""Write docs/reference/config.md from conf/ at build time (mkdocs-gen-files).

Every file of conf/ becomes a table: each key (dotted, as on the command line), its default
as written in the YAML, and the comment beside it (or, when the line has none, the comment
lines right above it). Values are read with ruamel.yaml's round-trip loader (so the order is
the file's); comments with a line scanner, since YAML parsers keep comments only loosely
attached. Run it alone to print the page: ``python docs/gen_ref.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
PAGE = "reference/config.md"

# What each group of conf/ chooses, in the order the page lists them.
GROUPS = {
    "data": "the corpus and direction (or NW's synthetic data)",
    "model": "the model, its sizes, the lab around it (`task`) and its decoding",
    "optimizer": "the optimizer, built with `hydra.utils.instantiate` (`_partial_: true`)",
    "device": "Lightning `Trainer` arguments: where and on how many processes",
    "trainer": "Lightning `Trainer` arguments: epochs, precision, clipping",
    "callbacks": "Lightning callbacks beside the checkpoints",
    "experiment": "whole recipes, chosen with `+experiment=<name>` (`# @package _global_`)",
    "profile": "settings of a (data, model) pair, applied by `conf/config.yaml` itself",
}
KEY = re.compile(
    r"^(?P<indent>\s*)(?P<dash>-\s+)?(?P<key>[A-Za-z_@/][\w@/.\-]*|\"[^\"]+\"|'[^']+')\s*:(?:\s+|$)(?P<rest>.*)$"
)


def split_comment(text: str) -> tuple[str, str]:
    """(value, comment) of the rest of a YAML line: the comment starts at a `#` preceded by
    whitespace outside quotes."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].strip(), text[i + 1 :].strip()
    return text.strip(), ""


def balanced(text: str) -> bool:
    return text.count("{") + text.count("[") == text.count("}") + text.count("]")


def scan(path: Path) -> tuple[str, list[tuple[str, str, str]]]:
    """(the file's leading comment, [(dotted key, value as written, comment)]) of one YAML file.

    A mapping key whose value is a nested block gets no row of its own unless it has a
    comment; its children are listed with dotted names. The defaults list is one row."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header: list[str] = []
    i = 0
    while i < len(lines) and (lines[i].startswith("#") or not lines[i].strip()):
        if lines[i].startswith("#") and not lines[i].startswith("# @package"):
            header.append(lines[i].lstrip("#").strip())
        i += 1
    rows: list[tuple[str, str, str]] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    pending: list[str] = []  # comment lines right above the next key
    while i < len(lines):
        line = lines[i]
        i += 1
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = KEY.match(line)
        if not m or m["dash"]:  # a list item (the defaults list is read below)
            pending = []
            continue
        indent, key = len(m["indent"]), m["key"].strip("\"'")
        value, comment = split_comment(m["rest"])
        while value and not balanced(value) and i < len(lines):  # a flow mapping over lines
            more, more_comment = split_comment(lines[i].strip())
            value, comment, i = f"{value} {more}", comment or more_comment, i + 1
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        note = comment or " ".join(pending)
        pending = []
        if key == "defaults" and not value:
            items = []
            while i < len(lines) and (lines[i].strip().startswith("-") or lines[i].strip().startswith("#")):
                item = lines[i].strip()
                i += 1
                if item.startswith("-"):
                    items.append(split_comment(item[1:].strip())[0])
            rows.append((dotted, "[" + ", ".join(items) + "]", note or "the defaults list (Hydra)"))
            continue
        if value:
            rows.append((dotted, value, note))
        else:
            stack.append((indent, key))
            if note:
                rows.append((dotted, "", note))
    return " ".join(header), rows


def cell(text: str) -> str:
    """Text for a table cell: pipes outside code spans escaped (Markdown tables take a pipe
    inside a code span as text)."""
    parts = text.split("`")
    return "`".join(p.replace("|", "\\|") if i % 2 == 0 else p for i, p in enumerate(parts))


def prose(text: str) -> str:
    """A YAML comment as Markdown: `<model>` and `*` are text, not HTML or emphasis (code spans
    are kept as they are)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
    return cell("`".join(parts))


def table(rows: list[tuple[str, str, str]]) -> list[str]:
    if not rows:
        return ["(no keys)", ""]
    out = ["| key | default | comment |", "|---|---|---|"]
    for key, value, comment in rows:
        shown = f"`{value}`" if value else ""
        out.append(f"| `{key}` | {shown} | {prose(comment)} |")
    return out + [""]


def check_loads(path: Path) -> None:
    """Fail the build on a file ruamel.yaml cannot read (a broken conf/ is a broken page)."""
    try:
        from ruamel.yaml import YAML
    except ImportError:  # the line scanner alone then
        return
    YAML(typ="rt").load(path.read_text(encoding="utf-8"))


def section(path: Path, title: str, level: str = "###") -> list[str]:
    check_loads(path)
    header, rows = scan(path)
    out = [
        f"{level} {title}",
        "",
        f"`{path.relative_to(ROOT).as_posix()}`" + (f": {prose(header)}" if header else ""),
        "",
    ]
    if path.read_text(encoding="utf-8").lstrip().startswith(
        "# @package _global_"
    ) or "# @package _global_" in path.read_text(encoding="utf-8"):
        out += [
            "Keys are global (`# @package _global_`): `model.net.dropout`, not "
            f"`{path.parent.name}.model.net.dropout`.",
            "",
        ]
    return out + table(rows)


def page() -> str:
    out = [
        "# Configuration (`conf/`)",
        "",
        "Generated from `conf/` when the site is built (`docs/gen_ref.py`): every key, its default "
        "as written in the file, and the comment beside it. Every Hydra app in `src/` composes "
        "`conf/config.yaml`; choose an option of a group with `group=option` and set any key with "
        "`key=value` on the command line:",
        "",
        "```text",
        "python src/train.py model=transformer optimizer=adamw trainer.max_epochs=1 model.net.num_heads=8",
        "```",
        "",
        "A wrong option or a misspelled key stops the app before anything runs, with Hydra's "
        "error naming it. `dvc repro` passes the values of `params.yaml` to the apps as such "
        "overrides (see [Command-line scripts](cli.md)).",
        "",
        "## The root: `conf/config.yaml`",
        "",
    ]
    out += section(CONF / "config.yaml", "config.yaml", "###")[2:]
    out += ["## The download app: `conf/download.yaml`", ""]
    out += section(CONF / "download.yaml", "download.yaml")[2:]
    out += ["## Groups", ""]
    out += ["| group | chooses | options |", "|---|---|---|"]
    for group, what in GROUPS.items():
        options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
        out.append(f"| [`{group}`](#{group}) | {what} | " + ", ".join(f"`{o}`" for o in options) + " |")
    out.append("")
    others = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in GROUPS)
    for group in list(GROUPS) + others:
        out += [f"### {group} {{#{group}}}", ""]
        if group in GROUPS:
            out += [f"Chooses {GROUPS[group]}.", ""]
        for path in sorted((CONF / group).glob("*.yaml")):
            out += section(path, f"`{group}={path.stem}`", "####")
    return "\n".join(out) + "\n"


def write() -> None:
    """Write the page into the site being built (mkdocs-gen-files' virtual files)."""
    import mkdocs_gen_files

    with mkdocs_gen_files.open(PAGE, "w") as f:
        f.write(page())
    mkdocs_gen_files.set_edit_path(PAGE, "gen_ref.py")


if __name__ == "__main__":  # by hand: print the page
    print(page())
elif __name__ == "<run_path>":  # mkdocs-gen-files runs its scripts with runpy.run_path
    write()
