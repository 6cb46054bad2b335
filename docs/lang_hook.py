"""MkDocs hook: a Chinese page (NAME.zh.md, NAME.zh.py) is marked as Chinese, ``<html lang="zh">``.

The theme writes one language for the whole site (``lang="en"``); screen readers, search engines
and the browser's fonts and hyphenation read the attribute per page.
"""

from __future__ import annotations

import re


def on_post_page(output: str, page, config) -> str:
    if re.search(r"\.zh\.(md|py)$", page.file.src_uri):
        return re.sub(r'<html lang="[^"]*"', '<html lang="zh"', output, count=1)
    return output
