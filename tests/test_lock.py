"""requirements.lock and pyproject.toml cannot silently disagree.

The lock is written by `make lock` (uv pip compile of pyproject.toml's dependencies and extras, with
lock-constraints.txt); these checks fail when someone edits one without the other.
"""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins(path: Path) -> dict[str, Version]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-\[\],]+)==([^\s;]+)(\s*;.*)?", line)
        assert match, f"{path.name}: {line!r} is not an exact pin (name==version)"
        name = canonicalize_name(match.group(1).split("[")[0])
        assert name not in pins, f"{path.name} pins {name} twice"
        pins[name] = Version(match.group(2))
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


def test_every_declared_requirement_is_pinned_and_satisfied():
    pins = _pins(ROOT / "requirements.lock")
    for req in _declared():
        name = canonicalize_name(req.name)
        assert name in pins, (
            f"pyproject.toml needs {req} but requirements.lock does not pin it: run `make lock`")
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, outside pyproject.toml's {req}: run `make lock`")


def test_lock_constraints_are_what_the_lock_pins():
    pins = _pins(ROOT / "requirements.lock")
    for name, version in _pins(ROOT / "lock-constraints.txt").items():
        assert pins.get(name) == version, (
            f"lock-constraints.txt wants {name}=={version}, the lock has {pins.get(name)}")


def test_conda_environment_installs_the_same_lock():
    """The lock is installed as it is (--no-deps), never resolved again: pip's resolver refuses it
    (unsloth's caps on trl and datasets, which lock-overrides.txt overrides)."""
    text = (ROOT / "environment.yml").read_text()
    assert "python=3.11" in text and "pip install --no-deps -r requirements.lock -e ." in text
    assert "- pip:" not in text, "a pip: section makes pip resolve the lock again, which fails"


def test_pins_parser_refuses_loose_lines(tmp_path):
    import pytest

    bad = tmp_path / "lock.txt"
    bad.write_text("torch>=2\n")
    with pytest.raises(AssertionError, match="not an exact pin"):
        _pins(bad)
    bad.write_text("torch==2.1\nTorch==2.2\n")
    with pytest.raises(AssertionError, match="twice"):
        _pins(bad)


def test_installed_packages_carry_their_bytecode():
    """Without .pyc files every rank, kernel and Ray worker compiles torch and Ray from source on start
    (where PYTHONDONTWRITEBYTECODE is set, every time): tools/build_venv.py's uv `--compile-bytecode`."""
    import importlib.util

    missing = []
    for name in ("torch.nn.modules.module", "ray._private.worker", "pandas.core.frame",
                 "transformers.modeling_utils"):
        source = importlib.util.find_spec(name).origin
        if not Path(importlib.util.cache_from_source(source)).is_file():
            missing.append(source)
    assert not missing, (
        f"no bytecode for {missing}: the environment was installed without it (uv pip install without "
        "--compile-bytecode); rebuild it with `make clean-venv venv`, or run "
        "`python -m compileall -q -j 0 $(python -c 'import site; print(site.getsitepackages()[0])')`")


def test_what_the_overrides_leave_out_is_neither_locked_nor_installed():
    """rfc3987-syntax made every Ray process build a Lark grammar on import (lock-overrides.txt): a
    `make lock` without the overrides, or an environment built before them, would bring it back unnoticed."""
    import importlib.metadata
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from build_venv import excluded_packages
    finally:
        sys.path.remove(str(ROOT / "tools"))
    excluded = excluded_packages()
    assert "rfc3987-syntax" in excluded
    pins = _pins(ROOT / "requirements.lock")
    locked = [name for name in excluded if canonicalize_name(name) in pins]
    assert not locked, f"requirements.lock pins {locked}, left out by lock-overrides.txt: run `make lock`"
    installed = []
    for name in excluded:
        try:
            importlib.metadata.distribution(name)
            installed.append(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    assert not installed, (f"{installed} installed although lock-overrides.txt leaves it out: "
                           "`python tools/build_venv.py` removes it, or `pip uninstall` it")


def test_axolotl_environment_locks_what_it_asks_for_on_the_gallerys_torch():
    """Notebook 09's second environment: every requirement of envs/axolotl/requirements.in and every override
    pinned as asked, on the gallery's torch/torchvision pair (the ranks and the kernel share tensors)."""
    folder = ROOT / "envs" / "axolotl"
    pins = _pins(folder / "requirements.lock")
    for path in (folder / "requirements.in", folder / "overrides.txt"):
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                req = Requirement(line)
                name = canonicalize_name(req.name)
                assert name in pins and req.specifier.contains(pins[name]), (
                    f"{path.name} asks for {req}, envs/axolotl/requirements.lock has {pins.get(name)}: "
                    "run `make lock-axolotl`")
    for name, version in _pins(ROOT / "lock-constraints.txt").items():
        assert pins[name] == version, f"envs/axolotl pins {name}=={pins[name]}, the gallery {version}"
    # 09 on a cluster: Axolotl's environment drives the same Ray cluster the gallery's notebooks join
    assert pins["ray"] == _pins(ROOT / "requirements.lock")["ray"], "one Ray version in both environments"


def test_a_package_built_without_isolation_is_installed_after_the_rest(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from build_venv import split_lock
    finally:
        sys.path.remove(str(ROOT / "tools"))
    lock = tmp_path / "requirements.lock"
    lock.write_text("axolotl==0.13.2\n    # via -r requirements.in\ntorch==2.14.1\nsetuptools==84.2.1\n")
    first, later = split_lock(lock, ["axolotl"], tmp_path)
    assert later == ["axolotl==0.13.2"]
    assert "axolotl" not in first.read_text() and "torch==2.14.1" in first.read_text()
    with pytest.raises(SystemExit, match=r"--no-build-isolation \['xformers'\]: not pinned"):
        split_lock(lock, ["xformers"], tmp_path)


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_build_installs_the_lock_as_it_is_then_the_unisolated_packages_and_the_project(tmp_path, monkeypatch,
                                                                                         installer):
    """The commands `tools/build_venv.py` runs: the lock without resolving (--no-deps), what the overrides
    leave out removed, the packages built without isolation after the rest, the project editable."""
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_venv
    finally:
        sys.path.remove(str(ROOT / "tools"))
    venv, lock = tmp_path / "venv", tmp_path / "requirements.lock"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    lock.write_text("axolotl==0.13.2\ntorch==2.14.1\n")
    commands = []
    monkeypatch.setattr(build_venv, "run", lambda cmd, env=None, cwd=None: commands.append(
        [c if not c.endswith(".first.txt") else "FIRST" for c in cmd]))
    monkeypatch.setattr(build_venv, "find_uv", lambda python: "uv" if installer == "uv" else None)
    monkeypatch.setattr(build_venv, "ensure_pip", lambda python: None)
    monkeypatch.setattr(build_venv, "pip_settings", lambda python=None: {"index-url": ["https://mirror"]})
    monkeypatch.setattr(build_venv, "excluded_packages", lambda: ["triton"])
    used = build_venv.build(venv, lock, tmp_path / "project", installer, unisolated=["axolotl"])
    py, index = str(venv / "bin" / "python"), ["--index-url", "https://mirror"]
    if installer == "uv":
        expected = [
            ["uv", "pip", "install", "--quiet", "--compile-bytecode", "--no-deps", "--python", py, *index,
             "-r", "FIRST"],
            ["uv", "pip", "uninstall", "--quiet", "--python", py, "triton"],
            ["uv", "pip", "install", "--quiet", "--no-deps", "--python", py, *index, "-e",
             str(tmp_path / "project")],
            ["uv", "pip", "install", "--quiet", "--compile-bytecode", "--no-deps", "--no-build-isolation",
             "--python", py, *index, "axolotl==0.13.2"],
        ]
    else:
        expected = [
            [py, "-m", "pip", "install", "--quiet", "--no-deps", "-r", "FIRST"],
            [py, "-m", "pip", "uninstall", "--quiet", "--yes", "triton"],
            [py, "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(tmp_path / "project")],
            [py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "axolotl==0.13.2"],
        ]
    assert used == installer and commands == expected
