"""Notebook 02 under papermill: bad input.

The defaults (processes='auto' = 2 CPU processes here) are covered by nbval over notebooks/, learning bars and
reference run included; the user's path parameters (a COCO-layout folder of JPEGs of COCO's size, a ResNet-50
checkpoint, an output folder) by the scale-up run in test_scale_up.py. Bad input is tested on
`check_coco_detection` and `read_coco_folder` directly in test_data_coco_shapes.py; here, that the notebook
stops on it before launching anything, on a list given with papermill's `-p` (which passes it as text), and on
a name to register the model under with tracking off. And (make test-cluster) the training on the two-node Ray
cluster.
"""

import shutil

import pytest

from helpers import tracking
from helpers.data.coco_shapes import build_coco_shapes
from tests.support import stream_text

pytestmark = pytest.mark.notebook



def test_bad_input_stops_before_launch(refusals, tmp_path, monkeypatch):
    monkeypatch.setenv(tracking.ENV_SWITCH, "off")   # the kernel's: a registry name needs tracking on
    shapes = build_coco_shapes(tmp_path / "coco", n_train=4, n_val=2)
    mine = tmp_path / "mine"
    shutil.copytree(shapes.root, mine)
    next((mine / "val2017").glob("*.png")).unlink()
    missing, listed, unregistrable = refusals("02_ddp_retinanet", dict(data_path=str(mine)),
        # `-p anchor_ratios '[0.5, 1.0, 2.0]'` gives the notebook text, not a list
        {"anchor_ratios": "[0.5, 1.0, 2.0]"},
        {"register_as": "shapes-retinanet"})
    assert "images listed in instances_val2017.json are missing" in missing.error
    assert "pass it as YAML instead" in listed.error
    assert "tracking is off" in unregistrable.error
    assert "launching" not in missing.output + listed.output + unregistrable.output, (
        "the notebook launched ranks on bad input")


@pytest.mark.cluster
def test_two_nodes(run_notebook, tmp_path, two_node_cluster):
    """cluster=<address>: the training launch runs one rank per node, each checking that it sees the marked
    data folder and output folder; rank 0's checkpoint, written from its node, is what the kernel reloads. A
    small data set, 2 steps: the checks that hold at any length run (the parity proof, on this machine, the
    untrained baseline, the checkpoint is the best epoch's)."""
    ckpt = tmp_path / "ckpt"
    nb, metrics = run_notebook("02_ddp_retinanet", processes=2, cluster=two_node_cluster.address,
                               n_train=16, n_val=8, epochs=1, max_steps=2, parity_steps=1,
                               output_dir=str(ckpt))
    out = stream_text(nb)
    assert metrics["nodes"] == 2
    assert "2 rank(s) ran on 2 node(s)" in out and "all checks passed" in out
    assert "[rank1] rank 1/2 on cpu" in out   # rank 1's own line came back from the other node
    assert [p.name for p in ckpt.iterdir()] == ["retinanet_mobilenet_v3_best.pt"], "a marker was left behind"
