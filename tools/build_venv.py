"""Build a virtual environment from a pinned lock with uv, or with pip where uv cannot be had.

`make run` and `make test` call this on first use (and whenever the lock or pyproject.toml changes).
uv installs the same pinned lock as pip in a fraction of the time (this machine: see
benchmarks/setup_time.py); where uv is not on PATH it is installed with pip into the new environment
first (a few seconds), and where that fails too the environment is built with pip, after a one-line
notice. Either way the result is the same set of pinned packages: the lock is installed as it is,
without resolving again (`--no-deps`; it is complete, being a resolution), so that what
lock-overrides.txt leaves out stays out, and is removed from an environment built before it was left out.

Both write the packages' bytecode (.pyc) at install time: pip does by default, uv only when asked
(`--compile-bytecode`), and without it every process compiles every module it imports from source, on
a machine that sets PYTHONDONTWRITEBYTECODE (ours does) on every start: each process that imports Ray
Train, transformers or DeepSpeed would pay for it again, where compiling costs once, at set-up
(benchmarks/setup_time.py times the set-up).

pip's own configuration (pip.conf and PIP_* variables: index-url, extra-index-url, find-links,
constraint, cert, trusted-host) is passed on to uv, which does not read it: a machine that reaches its
packages through a mirror or a local wheel folder works the same with both.

    python tools/build_venv.py [--venv .venv] [--lock requirements.lock] [--editable .]
                               [--installer auto|uv|pip]
    python tools/build_venv.py --compile [--upgrade-package NAME ...]   # the lock, from pyproject.toml
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK_CONSTRAINTS = ROOT / "lock-constraints.txt"
LOCK_OVERRIDES = ROOT / "lock-overrides.txt"


def excluded_packages(overrides: Path = LOCK_OVERRIDES) -> list[str]:
    """The packages lock-overrides.txt leaves out (a marker that never holds): see that file for why."""
    names = []
    for line in overrides.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.replace("'", '"').replace(" ", "").endswith('sys_platform=="never"'):
            names.append(line.split(";", 1)[0].strip())
    return names


def pip_settings(python: str = sys.executable) -> dict[str, list[str]]:
    """pip's effective settings that matter for finding packages, from `pip config list` (files and env)."""
    wanted = {"index-url", "extra-index-url", "find-links", "constraint", "cert", "trusted-host"}
    settings: dict[str, list[str]] = {}
    try:
        out = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return settings
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name not in wanted:
            continue
        value = value.strip().strip("'\"")
        items = value.split() if name != "cert" else [value]
        # Environment variables (":env:") override the files, as pip itself does.
        if key.startswith(":env:") or name not in settings:
            settings[name] = items
    return settings


def uv_arguments(settings: dict[str, list[str]]) -> tuple[list[str], dict[str, str]]:
    """uv's command-line flags and environment for pip's settings."""
    args: list[str] = []
    env: dict[str, str] = {}
    if settings.get("index-url"):
        args += ["--index-url", settings["index-url"][0]]
    for url in settings.get("extra-index-url", []):
        args += ["--extra-index-url", url]
    for link in settings.get("find-links", []):
        args += ["--find-links", link]
    for path in settings.get("constraint", []):
        if Path(path).is_file():
            args += ["--constraint", path]
    for host in settings.get("trusted-host", []):
        args += ["--allow-insecure-host", host]
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"][0]
    if len([a for a in args if a in ("--index-url", "--extra-index-url", "--find-links")]) > 1:
        # pip takes the best version across all indexes; uv by default stops at the first index that has
        # the package.
        args += ["--index-strategy", "unsafe-best-match"]
    return args, env


def ensure_pip(venv_python: Path) -> None:
    """An environment made by `uv venv` (or `virtualenv --no-pip`) has no pip: add the standard library's."""
    has_pip = (
        subprocess.run([str(venv_python), "-m", "pip", "--version"], capture_output=True).returncode == 0
    )
    if not has_pip:
        subprocess.run(
            [str(venv_python), "-m", "ensurepip", "--upgrade", "--default-pip"],
            check=True,
            capture_output=True,
        )


def find_uv(venv_python: Path) -> str | None:
    """uv on PATH, in the new environment, or beside this interpreter; else uv installed into the new
    environment with its own pip; None if none of these works."""
    found = shutil.which("uv")
    if found:
        return found
    local = venv_python.parent / "uv"
    if local.exists():
        return str(local)
    beside = Path(sys.executable).parent / "uv"   # a second environment built by the first's python (make)
    if beside.exists():
        return str(beside)
    try:
        ensure_pip(venv_python)
    except (OSError, subprocess.CalledProcessError):
        return None
    result = subprocess.run(
        [str(venv_python), "-m", "pip", "install", "--quiet", "uv"], capture_output=True, text=True
    )
    if result.returncode == 0 and local.exists():
        return str(local)
    return None


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})}, cwd=cwd)


def split_lock(lock: Path, unisolated: list[str], folder: Path) -> tuple[Path, list[str]]:
    """The lock without the packages built without isolation, and those packages' pinned lines.

    A source archive whose setup.py imports torch (axolotl's) must be built against the environment's own
    torch, so it is installed in a second step, after everything it needs to build is in place.
    """
    wanted = {n.lower().replace("_", "-") for n in unisolated}
    kept, later = [], []
    for line in lock.read_text().splitlines():
        name = line.split("==", 1)[0].strip().lower().replace("_", "-")
        (later if "==" in line and name in wanted else kept).append(line)
    missing = wanted - {line.split("==", 1)[0].strip().lower().replace("_", "-") for line in later}
    if missing:
        raise SystemExit(f"--no-build-isolation {sorted(missing)}: not pinned in {lock}; add it there")
    first = folder / f"{lock.stem}.first.txt"
    first.write_text("\n".join(kept) + "\n")
    return first, [line.split(";", 1)[0].split("\\", 1)[0].strip() for line in later]


@dataclass(frozen=True)
class Installer:
    """Installs into the environment of `python`: with uv (given pip's settings as its flags and
    environment) or, with `uv` None, with that environment's own pip."""

    python: Path
    uv: str | None = None
    uv_args: tuple[str, ...] = ()
    env: dict[str, str] | None = None

    @property
    def name(self) -> str:
        return "pip" if self.uv is None else "uv"

    def install(self, *targets: str, bytecode: bool = True, isolation: bool = True) -> None:
        """`pip install --no-deps`: the pins as they are, never resolved again. uv writes bytecode only when
        asked (`bytecode`), pip always."""
        flags = ["--no-deps", *([] if isolation else ["--no-build-isolation"])]
        if self.uv is None:
            run([str(self.python), "-m", "pip", "install", "--quiet", *flags, *targets])
            return
        compiled = ["--compile-bytecode"] if bytecode else []
        run([self.uv, "pip", "install", "--quiet", *compiled, *flags, "--python", str(self.python),
             *self.uv_args, *targets], self.env)

    def uninstall(self, *packages: str) -> None:
        if self.uv is None:
            run([str(self.python), "-m", "pip", "uninstall", "--quiet", "--yes", *packages])
        else:
            run([self.uv, "pip", "uninstall", "--quiet", "--python", str(self.python), *packages], self.env)


def with_uv(python: Path, uv: str) -> Installer:
    args, env = uv_arguments(pip_settings(str(python)))
    return Installer(python, uv, tuple(args), env)


def build(venv: Path, lock: Path, editable: Path | None, installer: str = "auto",
          unisolated: list[str] | None = None) -> str:
    """Create `venv` (if missing) and install `lock` (and `editable`, without dependencies) into it.

    `unisolated` names packages of the lock built without build isolation, installed after the rest.
    Returns the installer that did it, "uv" or "pip".
    """
    if not lock.is_file():
        raise SystemExit(f"no lock file {lock}: run `make lock` to write it from pyproject.toml")
    python = venv / "bin" / "python"
    if unisolated:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            first, later = split_lock(lock, unisolated, Path(folder))
            used = build(venv, first, editable, installer)
            uv = find_uv(python) if used == "uv" else None
            (with_uv(python, uv) if uv is not None else Installer(python)).install(*later, isolation=False)
            return used
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)])
    uv = find_uv(python) if installer in ("auto", "uv") else None
    if uv is None and installer == "uv":
        raise SystemExit("--installer uv: uv is not on PATH and could not be installed with pip")
    if uv is not None:
        try:
            return install_lock(with_uv(python, uv), lock, editable)
        except subprocess.CalledProcessError as e:
            if installer == "uv":
                raise
            print(f"notice: uv failed ({e}); installing with pip instead (slower)", flush=True)
    else:
        print("notice: uv is not available; installing with pip (slower)", flush=True)
    ensure_pip(python)
    return install_lock(Installer(python), lock, editable)


def install_lock(installer: Installer, lock: Path, editable: Path | None) -> str:
    """The lock as it is, less what lock-overrides.txt leaves out, then `editable`; the installer's name."""
    installer.install("-r", str(lock))
    excluded = excluded_packages()
    if excluded:
        installer.uninstall(*excluded)
    if editable is not None:
        installer.install("-e", str(editable), bytecode=False)
    return installer.name


def compile_lock(lock: Path, upgrade: list[str], venv: Path, requirements: Path | None = None,
                 overrides: Path = LOCK_OVERRIDES) -> None:
    """Rewrite the lock from pyproject.toml's dependencies and extras (or from a requirements file, for a
    second environment such as envs/axolotl); pins are kept unless upgraded."""
    python = venv / "bin" / "python"
    uv = shutil.which("uv") or (str(python.parent / "uv") if (python.parent / "uv").exists() else None)
    if uv is None:
        raise SystemExit("`make lock` needs uv: `make venv` installs it into .venv, or `pip install uv`")
    settings = pip_settings()
    sources = ["pyproject.toml", "--all-extras"]
    if requirements is not None:
        sources = [str(requirements.resolve().relative_to(ROOT))]
    settings.pop("constraint", None)  # a machine's own caps must not shape (or be named in) the shared lock
    args, env = uv_arguments(settings)
    cmd = [
        uv,
        "pip",
        "compile",
        *sources,
        "--python-version",
        "3.11",
        "--constraint",
        LOCK_CONSTRAINTS.name,
        "--override",
        str(overrides.resolve().relative_to(ROOT)),
        "--no-header",
        "--quiet",
        *args,
        "-o",
        str(lock.resolve().relative_to(ROOT)),
    ]
    for name in upgrade:
        cmd += ["--upgrade-package", name]
    run(cmd, env, cwd=ROOT)  # relative paths, so the lock's "# via" notes name no machine's folders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--venv", default=str(ROOT / ".venv"))
    parser.add_argument("--lock", default=str(ROOT / "requirements.lock"))
    parser.add_argument("--editable", default=str(ROOT), help="a project to install editable ('' for none)")
    parser.add_argument(
        "--installer", choices=("auto", "uv", "pip"), default=os.environ.get("VENV_INSTALLER", "auto")
    )
    parser.add_argument("--no-build-isolation", action="append", default=[], metavar="NAME",
                        dest="unisolated", help="a package of the lock built without isolation (repeatable)")
    parser.add_argument("--compile", action="store_true", help="rewrite the lock from pyproject.toml")
    parser.add_argument("--upgrade-package", action="append", default=[], metavar="NAME")
    parser.add_argument("--requirements", default=None, help="with --compile: a requirements file to lock")
    parser.add_argument("--overrides", default=str(LOCK_OVERRIDES), help="with --compile: the overrides file")
    args = parser.parse_args(argv)
    if args.compile:
        compile_lock(Path(args.lock), args.upgrade_package, Path(args.venv),
                     Path(args.requirements) if args.requirements else None, Path(args.overrides))
        return 0
    start = time.perf_counter()
    used = build(
        Path(args.venv), Path(args.lock), Path(args.editable) if args.editable else None, args.installer,
        args.unisolated,
    )
    print(
        f"{args.venv}: installed {Path(args.lock).name} with {used} in {time.perf_counter() - start:.0f} s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
