"""Fetch the raw corpora, verify SHA-256, write atomically.

Each file comes from ``$ATTNLAB_DATA_MIRROR/<relative path>`` when that
variable is set (a folder laid out like ``../shared/data``), else from its
canonical URL. A file is accepted only if its SHA-256 (or SHA-1) is one of the
known digests for it; it is written to a temporary file beside the target and
renamed, so a failed or corrupt download leaves nothing behind. A target that
already exists with a known digest is not fetched again; one that does not
match (e.g. a truncated archive from an interrupted copy) is fetched again and
replaced only once the new copy verifies.
"""

from __future__ import annotations
