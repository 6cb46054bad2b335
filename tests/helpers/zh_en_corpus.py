"""A small Chinese–English parallel corpus of our own making: tests/fixtures/zh-en.

Sentences are built from aligned lexicons, so the two sides translate each other exactly and a
small model learns them. They exercise what sets Chinese apart from English: no spaces between
words, measure words (三本书 "three books", 两杯茶 "two cups of tea"), time and place before the
verb (我昨天在市场买了三本书 "I bought three books at the market yesterday"), 了 for the past,
and the question particle 吗. Written in Multi30k's layout (``{train,val,test}.{zh,en}.gz``), a
fixed-seed sample of all the sentences the lexicons make.

    python tests/helpers/zh_en_corpus.py tests/fixtures/zh-en   # rewrites the committed files
"""

from __future__ import annotations

import gzip
import itertools
import random
import sys
from pathlib import Path

# (English, Chinese, third person singular)
SUBJECTS = [
    ("I", "我", False),
    ("you", "你", False),
    ("he", "他", True),
    ("she", "她", True),
    ("we", "我们", False),
    ("they", "他们", False),
    ("the child", "孩子", True),
    ("the teacher", "老师", True),
    ("my mother", "我妈妈", True),
    ("the old man", "那位老人", True),
]
# (English base, third person singular, past; Chinese, its past: 了 after an action, nothing
# after a state such as 有 "have")
VERBS = [
    ("buy", "buys", "bought", "买", "买了"),
    ("have", "has", "had", "有", "有"),
    ("want", "wants", "wanted", "想要", "想要"),
    ("see", "sees", "saw", "看到", "看到了"),
    ("need", "needs", "needed", "需要", "需要"),
    ("sell", "sells", "sold", "卖", "卖了"),
]
# (English singular, plural, Chinese noun, measure word)
OBJECTS = [
    ("apple", "apples", "苹果", "个"),
    ("book", "books", "书", "本"),
    ("cat", "cats", "猫", "只"),
    ("dog", "dogs", "狗", "只"),
    ("cup of tea", "cups of tea", "茶", "杯"),
    ("flower", "flowers", "花", "朵"),
    ("letter", "letters", "信", "封"),
    ("car", "cars", "车", "辆"),
    ("pen", "pens", "笔", "支"),
    ("chair", "chairs", "椅子", "把"),
]
NUMBERS = [("a", "一"), ("two", "两"), ("three", "三"), ("four", "四"), ("five", "五")]
TIMES = [("", ""), ("today", "今天"), ("every day", "每天")]
PLACES = [("", ""), ("at the market", "在市场"), ("in the shop", "在商店")]
SPLITS = {"train": 16000, "val": 500, "test": 500}


def _object(number: tuple[str, str], obj: tuple[str, str, str, str]) -> tuple[str, str]:
    (num_en, num_zh), (one, many, noun, measure) = number, obj
    en = f"an {one}" if num_en == "a" and one[0] in "aeiou" else f"{num_en} {one if num_en == 'a' else many}"
    return en, f"{num_zh}{measure}{noun}"


def _sentence(subject, verb, obj, time, place, kind: str) -> tuple[str, str]:
    """One (Chinese, English) pair; ``kind`` is ``present``, ``past`` or ``question``."""
    (s_en, s_zh, third), (base, third_form, past, v_zh, past_zh) = subject, verb
    (t_en, t_zh), (p_en, p_zh) = time, place
    if kind == "past":
        t_en, t_zh = "yesterday", "昨天"
    tail = " ".join(x for x in (obj[0], p_en, t_en) if x)
    if kind == "question":
        en = f"{'Does' if third else 'Do'} {s_en} {base} {tail}?"
        zh = f"{s_zh}{t_zh}{p_zh}{v_zh}{obj[1]}吗？"
    else:
        v_en = past if kind == "past" else (third_form if third else base)
        en = f"{s_en[0].upper()}{s_en[1:]} {v_en} {tail}."
        zh = f"{s_zh}{t_zh}{p_zh}{past_zh if kind == 'past' else v_zh}{obj[1]}。"
    return zh, en


def pairs(seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """The splits of :data:`SPLITS`: disjoint fixed-seed samples of every sentence, (zh, en)."""
    every = [
        _sentence(s, v, _object(n, o), t, p, kind)
        for s, v, o, n, t, p, kind in itertools.product(
            SUBJECTS, VERBS, OBJECTS, NUMBERS, TIMES, PLACES, ("present", "past", "question")
        )
        if not (kind == "past" and t[0])  # "yesterday" is the past's time
    ]
    every = sorted(set(every))
    random.Random(seed).shuffle(every)
    out, start = {}, 0
    for split, n in SPLITS.items():
        out[split], start = every[start : start + n], start + n
    return out


def write(folder: Path) -> None:
    """Write ``{split}.zh.gz`` and ``{split}.en.gz`` into ``folder`` (byte-identical every time)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, split_pairs in pairs().items():
        for i, lang in enumerate(("zh", "en")):
            text = "".join(pair[i] + "\n" for pair in split_pairs).encode("utf-8")
            (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress(text, mtime=0))


if __name__ == "__main__":
    write(Path(sys.argv[1]))
