"""`python tools/gpu_check ...` runs the check (the package's docstring says what it does)."""

import sys
from pathlib import Path

if not __package__:  # run as a folder: Python put the folder first on sys.path, where its parent belongs
    _folder = Path(__file__).resolve().parent
    sys.path = [str(_folder.parent), *(p for p in sys.path if Path(p or ".").resolve() != _folder)]
    from gpu_check.cli import main
else:
    from .cli import main

if __name__ == "__main__":
    sys.exit(main())
