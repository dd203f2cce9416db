"""Replacing a whole folder in one step, for a build whose output is a folder of files (MDS shards).

`helpers.files.atomic_write` does this for one file. For a folder, the new contents go to a temporary folder
beside the target; once they are complete the target is moved aside, the new folder renamed into its place
and the old one deleted. A crash or an error before the swap leaves the old folder whole, and no reader ever
meets a mix of old and new files (between the two renames the folder is briefly absent).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from helpers.files import temporary_sibling


@contextlib.contextmanager
def replaced_folder(target: str | Path) -> Iterator[Path]:
    """A path beside `target` (not created yet) to write the new folder to. When the block ends without an
    error the new folder becomes `target`, replacing any folder there; on an error it is deleted and
    `target` is left as it was."""
    target = Path(target)
    new = temporary_sibling(target)
    try:
        yield new
        _swap_in(new, target)
    finally:
        shutil.rmtree(new, ignore_errors=True)


def _swap_in(new: Path, target: Path) -> None:
    if not target.exists():
        os.replace(new, target)
        return
    old = temporary_sibling(target)
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)  # the old folder back, whole
        raise
    shutil.rmtree(old, ignore_errors=True)
