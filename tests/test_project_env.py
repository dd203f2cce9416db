"""The project's settings are GALLERY_<NAME> variables; an older HELPERS_<NAME> still works, with a
DeprecationWarning naming the new one."""

from __future__ import annotations

import warnings

import pytest

from helpers.env import project_env, project_env_name, project_flag


@pytest.fixture
def clean(monkeypatch):
    for name in ("GALLERY_PROBE", "HELPERS_PROBE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_new_name_is_read_without_a_warning(clean):
    clean.setenv("GALLERY_PROBE", "new")
    clean.setenv("HELPERS_PROBE", "old")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert project_env("PROBE") == "new"
    assert project_env_name("PROBE") == "GALLERY_PROBE"


def test_the_old_name_alone_works_and_names_the_new_one(clean):
    clean.setenv("HELPERS_PROBE", "old")
    with pytest.warns(DeprecationWarning, match="HELPERS_PROBE is deprecated: set GALLERY_PROBE instead"):
        assert project_env("PROBE") == "old"


def test_unset_gives_the_default(clean):
    assert project_env("PROBE") is None and project_env("PROBE", "x") == "x"
    assert project_flag("PROBE", default=True) is True


def test_a_switch_refuses_a_typo_naming_the_variable_that_holds_it(clean):
    clean.setenv("GALLERY_PROBE", "off")
    assert project_flag("PROBE") is False
    clean.setenv("GALLERY_PROBE", "maybe")
    with pytest.raises(ValueError, match="GALLERY_PROBE='maybe'"):
        project_flag("PROBE")
    clean.delenv("GALLERY_PROBE")
    clean.setenv("HELPERS_PROBE", "perhaps")
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="HELPERS_PROBE='perhaps'"):
        project_flag("PROBE")


def test_the_launchers_settings_use_the_prefix(monkeypatch):
    """What the launcher sets in a rank and reads from the user: one prefix."""
    from helpers import context
    from helpers.progress import settings

    names = [context.BACKEND_ENV, context.NODE_ENV, settings.PROGRESS_SWITCH_ENV, settings.PROGRESS_DIR_ENV]
    assert all(name.startswith("GALLERY_") for name in names), names
    monkeypatch.delenv("GALLERY_DIST_BACKEND", raising=False)
    monkeypatch.setenv("HELPERS_DIST_BACKEND", "gloo")
    with pytest.warns(DeprecationWarning, match="GALLERY_DIST_BACKEND"):
        assert context.worker_context().backend == "gloo"
