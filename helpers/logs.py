"""Logging the lessons do not want in their output: two import-time notices dropped by filter, and loggers
quieted for the length of a block.

The notices: every process that imports PEFT prints two since the lock carries Unsloth.

Why: Unsloth (notebook 08) brings bitsandbytes and torchao, and PEFT imports both when they are installed.
On a CPU with AVX512-BF16, bitsandbytes then looks for a kernel on the Hugging Face hub, which the gallery
cannot reach, and says so; torchao registers enums with torch's pytree, which torch 2.14 calls deprecated.
Neither is about the reader's code, and both would land in notebook outputs (nbval compares some of them).
Only those two messages are dropped, by a filter on the logger that emits each; the loggers keep their
levels and every other record.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator

NOTICES = {
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community",
    "torch.utils._pytree": "is an Enum subclass and is now natively supported by torch.compile",
}


class _DropNotice(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in str(record.msg)


def drop_import_notices() -> None:
    """Add the filters once (the loggers exist before the packages that use them are imported)."""
    for name, text in NOTICES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotice) for f in logger.filters):
            logger.addFilter(_DropNotice(text))


@contextlib.contextmanager
def quieted(names: Iterable[str], level: int = logging.ERROR) -> Iterator[None]:
    """Raise these loggers to `level` for the block, then give each back its own level."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, saved in zip(loggers, levels, strict=True):
            lg.setLevel(saved)
