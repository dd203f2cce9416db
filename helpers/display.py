"""Show a result in the notebook with machine-readable metadata beside it, or print it outside Jupyter.

The gallery reads results back from stored notebooks through that metadata (helpers.gallery.notebook_io), so
what a cell shows and what the tools read are one output.
"""

from __future__ import annotations

from typing import Any


def show_text(text: str, metadata: dict[str, Any], printed: str | None = None) -> None:
    """`text` as a plain-text display carrying `metadata` in a Jupyter kernel; else print `printed` or `text`.
    """
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display({"text/plain": text}, raw=True, metadata=metadata)
        return
    print(text if printed is None else printed)
