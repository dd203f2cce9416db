"""torchvision's detection models under DDP: what notebook 02 needs around its RetinaNet recipe.

The lesson's own code (the model assembled from torchvision's parts, the training loop, the launch) stays in
the notebook; this module holds what surrounds it:

* reading: torchvision's COCO reader, quiet, giving the targets its detectors take (`coco_detection`), the
  batches of a detection data set (lists, not stacked tensors: `collate`), DataLoader worker processes that
  work in a rank (`loader_workers`), a rank's share of the validation images (`evaluation_loader`);
* evaluation over ranks: COCO's mean average precision, each rank scoring its share of the validation images
  and torchmetrics gathering every rank's detections, so that all ranks get the whole split's mAP
  (`evaluate_map`);
* what torchvision's builders do that a model assembled from parts must repeat (`use_giou_loss`,
  `load_backbone_weights`), and the proof's frozen batch norm (`freeze_batch_norm`);
* the settings only this lesson has (`check_settings`), and its pictures (`grid`, `show_jpeg`).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKBONES = ("mobilenet_v3", "resnet18", "resnet50_fpn_v2")


def check_settings(backbone: Any, num_workers: Any, anchor_ratios: Any) -> None:
    """The lesson's own parameters, refused in the kernel before anything is built or launched."""
    from helpers.settings import check_choice, check_whole

    check_choice("backbone", backbone, BACKBONES)
    check_whole("num_workers", num_workers, minimum=0, hint=" (0 loads in the training process)")
    listed = isinstance(anchor_ratios, (list, tuple)) and len(anchor_ratios) > 0
    if not listed or not all(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0
                             for r in anchor_ratios):
        raise ValueError(f"anchor_ratios={anchor_ratios!r}: give a list of positive numbers. papermill's -p "
                         "passes a list as text; pass it as YAML instead: "
                         "-y 'anchor_ratios: [0.5, 1.0, 2.0]'.")


def coco_detection(images: str | Path, annotations: str | Path, transforms: Any = None) -> Any:
    """torchvision's `CocoDetection` over one split, wrapped for the v2 transforms: each item is an image and
    a target with `boxes` (XYXY pixels), `labels` (category ids) and `image_id`, what torchvision's detectors
    take. pycocotools prints a few lines each time it indexes a JSON: they are kept out of the notebook."""
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    with contextlib.redirect_stdout(io.StringIO()):
        dataset = CocoDetection(str(images), str(annotations), transforms=transforms)
    return wrap_dataset_for_transforms_v2(dataset, target_keys={"image_id", "boxes", "labels"})


def collate(batch: Sequence[tuple[Any, dict[str, Any]]]) -> tuple[list[Any], list[dict[str, Any]]]:
    """A detection batch: a list of images (of any sizes) and a list of targets (any number of boxes each),
    as torchvision's detectors take them. Boxes become plain tensors (the v2 wrapper's `BoundingBoxes` would
    carry their metadata through every operation), and an image without annotations gets empty ones."""
    import torch

    images, targets = zip(*batch, strict=True)
    return list(images), [{"boxes": t.get("boxes", torch.zeros(0, 4)).as_subclass(torch.Tensor),
                           "labels": t.get("labels", torch.zeros(0, dtype=torch.int64))} for t in targets]


def loader_workers(num_workers: int) -> dict[str, Any]:
    """DataLoader keywords for `num_workers` loader processes per rank (0: load in the rank itself).

    The loader processes are forked from the rank (Linux's usual way), which copies the data set as it is; the
    ranks themselves come from the launcher's forkserver, whose default would pickle the data set instead.
    They persist across epochs, so each epoch does not start them again.
    """
    if num_workers <= 0:
        return {"num_workers": 0}
    return {"num_workers": num_workers, "persistent_workers": True, "multiprocessing_context": "fork"}


def evaluation_loader(images: str | Path, annotations: str | Path, transforms: Any, num_workers: int = 0,
                      batch_size: int = 16) -> Any:
    """In a rank: a DataLoader over its share of a split, every world_size-th image from its rank on.

    Not a DistributedSampler: that one pads the last round with repeated images so that every rank gets as
    many, and an image scored twice would count twice in the mAP. Here every image is scored exactly once,
    and `evaluate_map` gathers the ranks' shares.
    """
    from torch.utils.data import DataLoader, Subset

    from helpers.context import worker_context

    ctx = worker_context()
    dataset = coco_detection(images, annotations, transforms)
    share = Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))
    return DataLoader(share, batch_size=batch_size, collate_fn=collate, **loader_workers(num_workers))


def use_giou_loss(head: Any) -> None:
    """The generalised-IoU box loss, as torchvision's `retinanet_resnet50_fpn_v2` builder sets it on its head.

    torchvision has no argument for it: the builder sets the regression head's loss type attribute, and a
    model assembled from the same parts must do the same to be that architecture."""
    head.regression_head._loss_type = "giou"


def load_backbone_weights(net: Any, weights_path: str | Path | None, backbone: str = "") -> None:
    """Load a local ImageNet checkpoint of the backbone (torchvision's `.pth`), or nothing (from scratch).

    The classifier's weights are not needed by a detector, so they may be missing; anything else missing means
    the file is not a checkpoint of this backbone, and is refused."""
    if weights_path is None:
        return
    import torch

    state = torch.load(weights_path, map_location="cpu", weights_only=True)
    missing, _ = net.load_state_dict(state, strict=False)
    if any(not k.startswith(("classifier", "fc.")) for k in missing):
        raise ValueError(f"{weights_path} is not an ImageNet checkpoint of {backbone or 'this backbone'}: "
                         f"it lacks {missing[:3]}")


def freeze_batch_norm(model: Any) -> Any:
    """Batch norm in eval mode in a model that trains: its statistics fixed, so a step gives each image the
    same result whatever else is in its rank's batch (the 1-vs-N proof's condition). Returns the model."""
    import torch.nn as nn

    for module in model.modules():
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)):
            module.eval()
    return model


@dataclass(frozen=True)
class MapResult:
    """COCO's mean average precision over the validation split: mAP (IoU 0.5 to 0.95), at 0.5 and at 0.75."""

    map: float
    map_50: float
    map_75: float
    per_class: dict[int, float] = field(default_factory=dict)   # category id -> AP (IoU 0.5 to 0.95)

    def scores(self) -> dict[str, float]:
        return {"map": self.map, "map_50": self.map_50, "map_75": self.map_75}


Batch = tuple[list[Any], list[dict[str, Any]]]   # images, targets


def evaluate_map(model: Any, loader: Iterable[Batch], device: Any) -> MapResult:
    """Run `model` (the module under DDP) over this rank's share of the validation images; return the mAP of
    the whole split, the same on every rank. Call it in every rank at once: `compute()` gathers the detections
    and targets of all ranks. The model is put back in training mode afterwards.

    fp32 (no autocast): boxes decoded in bf16 would lose pixels. torchmetrics' faster_coco_eval backend runs
    COCO's evaluation in C++: pycocotools' numbers, in under half the time.
    """
    import torch
    from torchmetrics.detection import MeanAveragePrecision

    metric = MeanAveragePrecision(iou_type="bbox", class_metrics=True, backend="faster_coco_eval").to(device)
    metric.warn_on_many_detections = False   # an untrained model returns up to 100 low-score boxes per image
    model.eval()
    with torch.no_grad():
        for images, targets in loader:
            predictions = model([image.to(device) for image in images])
            metric.update(predictions, [{k: v.to(device) for k, v in t.items()} for t in targets])
    result = metric.compute()
    model.train()
    classes = torch.atleast_1d(result["classes"]).tolist()
    per_class = torch.atleast_1d(result["map_per_class"]).tolist()
    return MapResult(result["map"].item(), result["map_50"].item(), result["map_75"].item(),
                     dict(zip(classes, per_class, strict=True)))


def grid(items: Sequence[tuple[Any, dict[str, Any]]], categories: dict[int, str],
                   predictions: Sequence[dict[str, Any]] | None = None, *, min_score: float = 0.3,
                   columns: int = 6, title: str | None = None) -> Any:
    """A grid of images with their true boxes (white) and, given `predictions`, the model's (magenta, with
    class and score): those scoring at least `min_score`, after a non-maximum suppression across classes
    (RetinaNet's own is per class, so one shape could carry two labels). Small images are drawn larger, so
    that the labels stay legible. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    import torch
    from torchvision.ops import nms
    from torchvision.utils import draw_bounding_boxes

    rows = max(1, -(-len(items) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(13, 2.4 * rows), squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for index, (ax, (image, target)) in enumerate(zip(axes.flat, items, strict=False)):
        zoom = max(1, 288 // max(image.shape[-2:])) if predictions is not None else 1
        picture = image if image.dtype == torch.uint8 else (image * 255).to(torch.uint8)
        picture = torch.nn.functional.interpolate(picture[None].float(), scale_factor=zoom)[0].to(torch.uint8)
        truth = None if predictions is not None else [categories.get(int(c), "?") for c in target["labels"]]
        picture = draw_bounding_boxes(picture, target["boxes"] * zoom, truth, colors="white", width=1)
        if predictions is not None:
            pred = predictions[index]
            keep = nms(pred["boxes"], pred["scores"], 0.5)   # one box per object, whichever class it names
            keep = keep[pred["scores"][keep] >= min_score]
            if len(keep):
                labels = [f"{categories.get(int(c), int(c))} {float(s):.2f}"
                          for c, s in zip(pred["labels"][keep], pred["scores"][keep], strict=True)]
                picture = draw_bounding_boxes(picture, pred["boxes"][keep] * zoom, labels, colors="magenta",
                                              width=2)
        ax.imshow(picture.permute(1, 2, 0).numpy())
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def show_jpeg(fig: Any, quality: int = 80) -> None:
    """Show a figure as a JPEG: textured pictures take a tenth of a PNG's bytes in the stored notebook."""
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    buffer = io.BytesIO()
    fig.savefig(buffer, format="jpeg", bbox_inches="tight", pil_kwargs={"quality": quality})
    plt.close(fig)
    display(Image(buffer.getvalue(), format="jpeg"))
