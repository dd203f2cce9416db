"""Environment variables: the project's own settings (`GALLERY_<NAME>`), on/off switches read one way,
temporary values restored exactly afterwards (set, changed or unset), and the variables that give a process
another machine's CPU arithmetic."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping

_OFF = frozenset({"0", "off", "false", "no"})
_ON = frozenset({"1", "on", "true", "yes"})
# Every setting of the project is read as PROJECT_PREFIX + its name; OLD_PREFIX + the name is still read, with
# a DeprecationWarning, where the new one is unset (for this release only).
PROJECT_PREFIX, OLD_PREFIX = "GALLERY_", "HELPERS_"


def project_env_name(name: str) -> str:
    """The variable that holds the project's setting `name`: `GALLERY_<name>`."""
    return PROJECT_PREFIX + name


def _project_variable(name: str) -> str | None:
    """The variable that sets `name` now: GALLERY_<name>, else HELPERS_<name> (with a warning), else None."""
    new, old = PROJECT_PREFIX + name, OLD_PREFIX + name
    if new in os.environ:
        return new
    if old in os.environ:
        warnings.warn(f"{old} is deprecated: set {new} instead ({old} stops working in the next release).",
                      DeprecationWarning, stacklevel=3)
        return old
    return None


def project_env(name: str, default: str | None = None) -> str | None:
    """The project's setting `name` (`project_env("PROGRESS")` reads GALLERY_PROGRESS); `default` if unset.

    Where only the older HELPERS_<name> is set, its value is used and a DeprecationWarning names the new
    variable.
    """
    variable = _project_variable(name)
    return os.environ[variable] if variable is not None else default


def env_flag(name: str, default: bool | None = None) -> bool | None:
    """An on/off switch: `on/1/true/yes` is True, `off/0/false/no` False, unset or empty `default`.

    Anything else is refused rather than guessed, so a typo does not silently mean "on".
    """
    return _flag(name, os.environ.get(name, ""), default)


def project_flag(name: str, default: bool | None = None) -> bool | None:
    """The project's on/off setting `name` (GALLERY_<name>), read as `env_flag` reads a switch."""
    variable = _project_variable(name)
    return default if variable is None else _flag(variable, os.environ[variable], default)


def _flag(variable: str, value: str, default: bool | None) -> bool | None:
    cleaned = value.strip().lower()
    if not cleaned:
        return default
    if cleaned in _OFF:
        return False
    if cleaned in _ON:
        return True
    raise ValueError(f"{variable}={value!r}: use 'on' or 'off' (or leave it unset).")


# Kernels of another instruction set, for ATen, oneDNN and MKL together, so one machine can check what another
# would compute (nbval's variants, the reference measurements, their cost benchmark). AVX2: the common machine
# without AVX-512. Baseline: a machine no one has (ATen without SIMD, oneDNN at SSE4.1, MKL at SSE4.2), as far
# from an AVX-512 host's arithmetic as these switches go.
ISA_AVX2: Mapping[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
ISA_BASELINE: Mapping[str, str] = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
}


@contextlib.contextmanager
def temporary_environ(values: Mapping[str, str | None], keep_existing: Iterable[str] = ()) -> Iterator[None]:
    """Set the variables (None unsets one) for the duration of the block, then put back what was there.

    Names in `keep_existing` keep a value the user already set: those are defaults, not overrides.
    """
    keep = set(keep_existing)
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if k in keep and saved[k] is not None:
                continue
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def with_own_inductor_cache(env: Mapping[str, str]) -> dict[str, str]:
    """`env`, plus a torch.compile cache of its own when it changes ATen's instruction set.

    Why: torch 2.14's Inductor reuses kernels from its on-disk cache across ATEN_CPU_CAPABILITY values. A
    process that loads kernels compiled under another capability can crash ("malloc(): unaligned tcache chunk
    detected", "free(): invalid pointer") or compute NaN losses (notebook 10's GPT does both). A simulated
    instruction set (the nbval variants, the reference-spread runs) must not poison the cache that the
    user's own runs read, so each capability gets its own folder.
    """
    import getpass
    import tempfile

    capability = env.get("ATEN_CPU_CAPABILITY")
    if not capability:
        return dict(env)
    folder = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_aten_{capability}")
    return {**env, "TORCHINDUCTOR_CACHE_DIR": folder}
