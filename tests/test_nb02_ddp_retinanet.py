"""Notebook 02 under papermill with parameters other than the stored defaults.

The defaults (processes='auto' = 2 CPU processes here) are covered by nbval over notebooks/. This file runs
one process, reading the data through the user's path parameters (a COCO-format copy in a temporary folder),
with the checkpoint in a temporary folder; the notebook's own checks (untrained mAP near zero, trained
mAP@0.5 >= 0.5, falling losses, best checkpoint reloaded) run inside it. Bad input is tested on
`check_coco_detection` directly in test_data_coco_shapes.py; here, once, that the notebook stops on it
before launching anything.
"""

import shutil

import nbformat
import pytest

from helpers.data.coco_shapes import build_coco_shapes
from tests.conftest import stream_text

pytestmark = pytest.mark.notebook


def test_one_process_on_user_paths(run_notebook, tmp_path):
    shapes = build_coco_shapes(tmp_path / "coco")   # the default build, as if it were the user's export
    paths = dict(images_dir=str(shapes.train_images), annotations_json=str(shapes.train_annotations),
                 val_images_dir=str(shapes.val_images), val_annotations_json=str(shapes.val_annotations))
    nb, metrics = run_notebook("02_ddp_retinanet", processes=1, checkpoint_dir=str(tmp_path / "ckpt"),
                               **paths)
    assert metrics["processes"] == 1
    assert metrics["map_50"] >= 0.5
    assert metrics["untrained_map_50"] < 0.1
    assert list((tmp_path / "ckpt").glob("retinanet_mobilenet_v3_best.pt"))
    out = stream_text(nb)
    assert "[rank0] rank 0/1 on cpu: 320 training images, 64 validation images" in out


def test_bad_input_stops_before_launch(run_notebook, tmp_path):
    from papermill.exceptions import PapermillExecutionError

    shapes = build_coco_shapes(tmp_path / "coco", n_train=4, n_val=2)
    images = tmp_path / "val_images"
    shutil.copytree(shapes.val_images, images)
    next(images.glob("*.png")).unlink()
    with pytest.raises(PapermillExecutionError, match="images listed in instances_val.json are missing"):
        run_notebook("02_ddp_retinanet", images_dir=str(shapes.train_images),
                     annotations_json=str(shapes.train_annotations), val_images_dir=str(images),
                     val_annotations_json=str(shapes.val_annotations))
    executed = nbformat.read(str(tmp_path / "02_ddp_retinanet-out.ipynb"), as_version=4)
    assert "launching" not in stream_text(executed), "the notebook launched ranks on bad input"
