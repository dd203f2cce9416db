"""The catalog of notebooks (helpers/gallery/catalog.py) against the files: one record per notebook, a
reference file per notebook that trains, a test file per notebook; and every list of notebooks the project
keeps is read from it."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from helpers.gallery import catalog, lesson_shape, scale_up, scale_up_table
from helpers.paths import ROOT


def test_the_catalog_agrees_with_the_files():
    assert catalog.problems() == []


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    notebooks, tests = tmp_path / "notebooks", tmp_path / "tests"
    (notebooks / "references").mkdir(parents=True)
    tests.mkdir()
    for nb in catalog.CATALOG:
        (notebooks / f"{nb.stem}.ipynb").write_text("{}")
        if nb.trains:
            shutil.copy(nb.reference, notebooks / "references")
    for test in (ROOT / "tests").glob("test_nb[0-9][0-9]_*.py"):
        (tests / test.name).write_text("")
    return notebooks, tests


def test_a_notebook_without_a_record_and_a_record_without_a_notebook_fail(tmp_path):
    notebooks, tests = _copy(tmp_path)
    assert catalog.problems(notebooks, tests) == []
    (notebooks / "11_new_lesson.ipynb").write_text("{}")
    assert any("11_new_lesson.ipynb has no record" in p for p in catalog.problems(notebooks, tests))
    (notebooks / "11_new_lesson.ipynb").unlink()
    (notebooks / "10_fast_and_elastic.ipynb").unlink()
    found = catalog.problems(notebooks, tests)
    assert any("notebooks/10_fast_and_elastic.ipynb does not exist" in p for p in found)


def test_a_missing_reference_or_test_file_fails(tmp_path):
    notebooks, tests = _copy(tmp_path)
    (notebooks / "references" / "04_fsdp_transformer.json").unlink()
    next(tests.glob("test_nb06_*.py")).unlink()
    found = "\n".join(catalog.problems(notebooks, tests))
    assert "04_fsdp_transformer trains but has no notebooks/references/04_fsdp_transformer.json" in found
    assert "06_ray_train_resnet has no test file" in found
    (notebooks / "references" / "00_getting_started.json").write_text("{}")
    found = "\n".join(catalog.problems(notebooks, tests))
    assert "00_getting_started.json belongs to no training notebook" in found


def test_a_training_record_needs_every_fact(tmp_path):
    notebooks, tests = _copy(tmp_path)
    broken = tuple(dataclasses.replace(nb, gpu_check=None) if nb.number == "03" else nb
                   for nb in catalog.CATALOG)
    assert any("03_lightning_two_tower_mds trains: its record needs" in p
               for p in catalog.problems(notebooks, tests, broken))


def test_every_list_of_notebooks_is_the_catalogs():
    training = [nb.stem for nb in catalog.training()]
    assert sorted(scale_up.SCALE_UPS) == training
    assert sorted(f"{n}" for n in lesson_shape.BUDGETS) == [s[:2] for s in training]
    assert set(scale_up_table.PLANNED) == {nb.stem for nb in catalog.CATALOG if nb.planned}
    from helpers import reference
    assert reference.REFERENCE_NOTEBOOKS == len(training)
    assert catalog.by_number("07").stem == "07_trl_sft_gpt_oss"
    with pytest.raises(KeyError, match="no notebook '12'"):
        catalog.by_number("12")
