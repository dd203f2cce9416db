"""Notebook 02 under papermill: bad input.

The defaults (processes='auto' = 2 CPU processes here) are covered by nbval over notebooks/, learning bars and
reference run included; the user's path parameters (COCO-format JPEGs of COCO's size, a ResNet-50 checkpoint,
a checkpoint folder) by the scale-up run in test_scale_up.py. Bad input is tested on
`check_coco_detection` directly in test_data_coco_shapes.py; here, that the notebook stops on it before
launching anything, on a list given with papermill's `-p` (which passes it as text), and on a name to
register the model under with tracking off.
"""

import shutil

import pytest

from helpers import tracking
from helpers.data.coco_shapes import build_coco_shapes

pytestmark = pytest.mark.notebook



def test_bad_input_stops_before_launch(refusals, tmp_path, monkeypatch):
    monkeypatch.setenv(tracking.ENV_SWITCH, "off")   # the kernel's: a registry name needs tracking on
    shapes = build_coco_shapes(tmp_path / "coco", n_train=4, n_val=2)
    images = tmp_path / "val_images"
    shutil.copytree(shapes.val_images, images)
    next(images.glob("*.png")).unlink()
    missing, listed, unregistrable = refusals("02_ddp_retinanet", dict(
        images_dir=str(shapes.train_images), annotations_json=str(shapes.train_annotations),
        val_images_dir=str(images), val_annotations_json=str(shapes.val_annotations)),
        # `-p anchor_ratios '[0.5, 1.0, 2.0]'` gives the notebook text, not a list
        {"anchor_ratios": "[0.5, 1.0, 2.0]"},
        {"register_as": "shapes-retinanet"})
    assert "images listed in instances_val.json are missing" in missing.error
    assert "pass it as YAML instead" in listed.error
    assert "tracking is off" in unregistrable.error
    assert "launching" not in missing.output + listed.output + unregistrable.output, (
        "the notebook launched ranks on bad input")
