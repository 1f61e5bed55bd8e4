"""The package's PEP 517 build backend: setuptools, run in a scratch copy of
hosts/python, so that `pip install hosts/python` (which builds in the source
folder) leaves no build/ or *.egg-info behind in the checkout.

Editable installs build in place: they are meant to point at the tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from setuptools import build_meta as _setuptools

# Importing this module has just written its bytecode next to it (the folder
# holds nothing else); a source install must leave the tree as it found it.
shutil.rmtree(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__"), ignore_errors=True)

# Editable installs (setuptools 64 and later), in place.
for _hook in ("get_requires_for_build_editable", "prepare_metadata_for_build_editable", "build_editable"):
    if hasattr(_setuptools, _hook):
        globals()[_hook] = getattr(_setuptools, _hook)


@contextlib.contextmanager
def _in_scratch_copy():
    """Runs the body in a copy of the current (source) folder, without the
    outputs an earlier in-place build may have left."""
    source = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="chstate-meltano-build-") as scratch:
        copy = os.path.join(scratch, "src")
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
        os.chdir(copy)
        try:
            yield
        finally:
            os.chdir(source)


def get_requires_for_build_wheel(config_settings=None):
    with _in_scratch_copy():  # setuptools runs egg_info to answer
        return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    with _in_scratch_copy():
        return _setuptools.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    target = os.path.abspath(metadata_directory)
    with _in_scratch_copy():
        return _setuptools.prepare_metadata_for_build_wheel(target, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    target = os.path.abspath(wheel_directory)
    metadata = os.path.abspath(metadata_directory) if metadata_directory else None
    with _in_scratch_copy():
        return _setuptools.build_wheel(target, config_settings, metadata)


def build_sdist(sdist_directory, config_settings=None):
    target = os.path.abspath(sdist_directory)
    with _in_scratch_copy():
        return _setuptools.build_sdist(target, config_settings)
