"""Loads the chstate C library for a test the way the installed Python adapter
does (chstate_meltano._native.library, found through $CHSTATE_LIBRARY), and
puts the environment back afterwards.

    with native_library.loaded(path) as lib:   # a ctypes.CDLL with the ABI's signatures
        ...
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hosts" / "python"))
from chstate_meltano import _native  # noqa: E402


@contextlib.contextmanager
def loaded(path):
    before = os.environ.get("CHSTATE_LIBRARY")
    os.environ["CHSTATE_LIBRARY"] = str(path)
    _native.library.cache_clear()
    try:
        yield _native.library()
    finally:
        if before is None:
            os.environ.pop("CHSTATE_LIBRARY", None)
        else:
            os.environ["CHSTATE_LIBRARY"] = before
        _native.library.cache_clear()
