"""helpers.integrations.torchvision_detection: notebook 02's plumbing around its RetinaNet recipe, on CPU, in
one process (the launches themselves run in the notebook's tests)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import tracking
from helpers.integrations import torchvision_detection as detection

SMALL = dict(n_train=6, n_val=5, seed=1)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    from helpers.data.coco_shapes import build_coco_shapes

    return build_coco_shapes(tmp_path_factory.mktemp("shapes"), **SMALL)


def test_the_lessons_own_settings_are_refused_with_the_fix():
    detection.check_settings("mobilenet_v3", 0, [0.5, 1.0, 2])
    with pytest.raises(ValueError, match="backbone='resnet34': use one of"):
        detection.check_settings("resnet34", 0, [1.0])
    with pytest.raises(ValueError, match="num_workers=-1"):
        detection.check_settings("resnet18", -1, [1.0])
    for bad in ("[0.5, 1.0, 2.0]", [], [1.0, 0], [True], 1.0):
        with pytest.raises(ValueError, match="pass it as YAML instead"):
            detection.check_settings("resnet18", 0, bad)


def test_a_coco_split_reads_as_detector_targets_and_batches_as_lists(shapes):
    from torchvision.transforms import v2

    dataset = detection.coco_detection(shapes.train_images, shapes.train_annotations, v2.ToImage())
    images, targets = detection.collate([dataset[0], dataset[1], (torch.zeros(3, 8, 8), {})])
    assert len(images) == 3 and images[0].shape == (3, 96, 96)
    assert type(targets[0]["boxes"]) is torch.Tensor and targets[0]["boxes"].shape[1] == 4   # plain tensors
    assert targets[0]["labels"].dtype == torch.int64 and len(targets[0]["labels"]) == len(targets[0]["boxes"])
    assert targets[2]["boxes"].shape == (0, 4) and targets[2]["labels"].shape == (0,)   # no annotations


def test_loader_workers():
    assert detection.loader_workers(0) == {"num_workers": 0}
    assert detection.loader_workers(4) == {"num_workers": 4, "persistent_workers": True,
                                           "multiprocessing_context": "fork"}


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_scores_its_share_unpadded(shapes, monkeypatch, rank):
    """5 images over 2 ranks: 3 and 2, none twice (a DistributedSampler would pad rank 1 to 3)."""
    from torchvision.transforms import v2

    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = detection.evaluation_loader(shapes.val_images, shapes.val_annotations, v2.ToImage(),
                                         batch_size=2)
    assert list(loader.dataset.indices) == [[0, 2, 4], [1, 3]][rank]
    assert sum(len(images) for images, _ in loader) == [3, 2][rank]


class Oracle(torch.nn.Module):
    """A stand-in detector: returns the true boxes of the images it is given (or shifted ones), score 0.9."""

    def __init__(self, truths: list[dict], shift: float = 0.0):
        super().__init__()
        self.truths, self.shift, self.calls = truths, shift, 0

    def forward(self, images):
        out = []
        for _ in images:
            t = self.truths[self.calls]
            self.calls += 1
            out.append({"boxes": t["boxes"] + self.shift, "labels": t["labels"],
                        "scores": torch.full((len(t["labels"]),), 0.9)})
        return out


def test_map_of_a_perfect_and_of_a_wrong_detector(shapes):
    from torchvision.transforms import v2

    dataset = detection.coco_detection(shapes.val_images, shapes.val_annotations, v2.ToImage())
    batches = [detection.collate([dataset[i] for i in range(len(dataset))])]
    truths = batches[0][1]
    perfect = detection.evaluate_map(Oracle(truths).train(), batches, "cpu")
    assert perfect.map == pytest.approx(1.0) and perfect.map_50 == pytest.approx(1.0)
    assert set(perfect.per_class) <= set(shapes.categories) and all(v == pytest.approx(1.0)
                                                                     for v in perfect.per_class.values())
    assert perfect.scores() == {"map": perfect.map, "map_50": perfect.map_50, "map_75": perfect.map_75}
    model = Oracle(truths, shift=60.0)
    wrong = detection.evaluate_map(model, batches, "cpu")
    assert wrong.map_50 < 0.2, "boxes 60 px off their objects must not score"
    assert model.training, "the model goes back to training mode"


def test_the_builders_own_settings_and_a_backbone_checkpoint(tmp_path):
    import torchvision
    from torchvision.models.detection.retinanet import RetinaNetHead

    head = RetinaNetHead(16, 9, 3, norm_layer=lambda c: torch.nn.GroupNorm(4, c))
    detection.use_giou_loss(head)
    stock = torchvision.models.detection.retinanet_resnet50_fpn_v2(weights=None, weights_backbone=None)
    loss_type = vars(stock.head.regression_head)["_loss_type"]
    assert vars(head.regression_head)["_loss_type"] == loss_type == "giou"

    net = torchvision.models.resnet18()
    path = tmp_path / "resnet18.pth"
    state = {k: v for k, v in torchvision.models.resnet18().state_dict().items() if not k.startswith("fc.")}
    torch.save(state, path)
    detection.load_backbone_weights(net, path, "resnet18")   # the classifier may be missing
    assert torch.equal(net.conv1.weight, state["conv1.weight"])
    detection.load_backbone_weights(net, None)                # from scratch: nothing loaded
    torch.save({"conv1.weight": state["conv1.weight"]}, path)
    with pytest.raises(ValueError, match="is not an ImageNet checkpoint of resnet18"):
        detection.load_backbone_weights(net, path, "resnet18")


def test_frozen_batch_norm_keeps_its_statistics_while_the_model_trains():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    before = model[1].running_mean.clone()
    detection.freeze_batch_norm(model)(torch.randn(2, 3, 8, 8))
    assert model.training and not model[1].training and torch.equal(model[1].running_mean, before)


def test_the_grids_draw_truths_and_predictions(shapes, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from torchvision.transforms import v2

    dataset = detection.coco_detection(shapes.val_images, shapes.val_annotations,
                                       v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]))
    items = [dataset[i] for i in range(3)]
    preview = detection.grid(items, shapes.categories)
    assert len(preview.axes) == 6 and sum(bool(ax.images) for ax in preview.axes) == 3
    predictions = Oracle([t for _, t in items])([image for image, _ in items])
    drawn = detection.grid(items, shapes.categories, predictions, min_score=0.95, title="t")
    assert drawn.axes[0].images[0].get_array().shape[0] == 96 * 3   # small images drawn larger
    shown = []
    monkeypatch.setattr("IPython.display.display", shown.append)
    detection.show_jpeg(drawn)
    assert shown and shown[0].data[:2] == b"\xff\xd8"   # a JPEG


class Detector(torch.nn.Module):
    """A model whose output is no tensor (a list of dicts, as a detector's): no signature describes it."""

    def forward(self, images):
        return [{"scores": image.mean().reshape(1)} for image in images]


def test_an_input_only_signature_for_a_detector(tmp_path, monkeypatch):
    """registry.log_model's `signature`: "inputs" describes the examples alone, a signature given is used as
    it is (an output a signature cannot describe fails the inference log_model makes otherwise)."""
    from mlflow.models import Model, infer_signature

    from helpers.registry import log_model

    monkeypatch.setenv(tracking.ENV_SWITCH, "off")
    examples = np.random.default_rng(0).random((2, 3, 4, 4), dtype=np.float32)
    with pytest.raises(AttributeError):
        log_model(Detector(), "99_test", examples=examples)
    logged = log_model(Detector(), "99_test", examples=examples, signature="inputs",
                       serialization_format="pickle")
    saved = Model.load(logged.uri)
    assert saved.signature.inputs is not None and saved.signature.outputs is None
    given = infer_signature(examples[:, 0])
    again = log_model(Detector(), "99_test", examples=examples[:, 0], signature=given,
                      serialization_format="pickle")
    assert Model.load(again.uri).signature == given
    answer = logged.load()([torch.from_numpy(examples[0])])
    assert answer[0]["scores"].item() == pytest.approx(float(examples[0].mean()))
