"""Notebook 02's mAP with torchmetrics' two COCO backends: time per evaluation, and the same numbers.

02 evaluates its 64 validation images nine times a run (before training and after each epoch), and every
rank computes the gathered metric, so the backend's speed counts: 02 uses `backend="faster_coco_eval"`
(C++) rather than pycocotools (Python loops). This builds 02's validation set (`build_coco_shapes`, the
notebook's defaults) and detections shaped like a RetinaNet's at `score_thresh=0.01` (~300 boxes an image:
each true box found with some pixels of error, the rest spread over the image, 4 classes), then times
`MeanAveragePrecision(iou_type="bbox", class_metrics=True).compute()` with each backend on one thread.

    .venv/bin/python benchmarks/map_backends.py [--repeats 5] [--detections 300] [--markdown FILE]

Exit status 1 if the backends disagree on any reported value (mAP, mAP@0.5, mAP@0.75, per class).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers.data.coco_shapes import build_coco_shapes  # noqa: E402

BACKENDS = ("pycocotools", "faster_coco_eval")
KEYS = ("map", "map_50", "map_75", "map_per_class")


def detections(n_val: int, per_image: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """02's validation targets and RetinaNet-shaped predictions for them."""
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2

    shapes = build_coco_shapes(n_train=320, n_val=n_val, seed=seed)
    with contextlib.redirect_stdout(io.StringIO()):   # pycocotools' index-building chatter
        coco = CocoDetection(str(shapes.val_images), str(shapes.val_annotations), transforms=v2.ToImage())
    data = wrap_dataset_for_transforms_v2(coco, target_keys={"boxes", "labels"})
    g = torch.Generator().manual_seed(seed)
    preds, targets = [], []
    for _, target in data:
        boxes, labels = target["boxes"].as_subclass(torch.Tensor), target["labels"]
        rest = per_image - len(boxes)
        xy = torch.rand(rest, 2, generator=g) * 80
        wh = torch.rand(rest, 2, generator=g) * 30 + 4
        found = boxes + torch.randn(boxes.shape, generator=g) * 2
        preds.append({"boxes": torch.cat([found, torch.cat([xy, xy + wh], 1)]),
                      "scores": torch.cat([0.3 + 0.7 * torch.rand(len(boxes), generator=g),
                                           0.5 * torch.rand(rest, generator=g)]),
                      "labels": torch.cat([labels, torch.randint(1, 5, (rest,), generator=g)])})
        targets.append({"boxes": boxes, "labels": labels})
    return preds, targets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--detections", type=int, default=300, help="predicted boxes per image")
    parser.add_argument("--val-images", type=int, default=64)
    parser.add_argument("--markdown", help="also write the report to this file (benchmarks/write_docs.py)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning, module="torchmetrics")
    torch.set_num_threads(1)
    from torchmetrics.detection import MeanAveragePrecision

    preds, targets = detections(args.val_images, args.detections)
    results, seconds = {}, {}
    for backend in BACKENDS:
        times = []
        for _ in range(args.repeats):
            metric = MeanAveragePrecision(iou_type="bbox", class_metrics=True, backend=backend)
            metric.warn_on_many_detections = False
            metric.update(preds, targets)
            start = time.perf_counter()
            result = metric.compute()
            times.append(time.perf_counter() - start)
        results[backend] = {k: result[k].tolist() for k in KEYS}
        seconds[backend] = sorted(times)
    lines = [f"{args.val_images} images, {args.detections} detections each, class_metrics=True, 1 thread, "
             f"{args.repeats} repeats.", "",
             "| backend | median (s) | min (s) | max (s) | mAP@0.5 |", "|---|---:|---:|---:|---:|"]
    for backend in BACKENDS:
        t = seconds[backend]
        lines.append(f"| {backend} | {t[len(t) // 2]:.3f} | {t[0]:.3f} | {t[-1]:.3f} | "
                     f"{results[backend]['map_50']:.6f} |")
    ratio = seconds["pycocotools"][args.repeats // 2] / seconds["faster_coco_eval"][args.repeats // 2]
    lines += ["", f"faster_coco_eval takes 1/{ratio:.1f} of pycocotools' time."]
    same = results["pycocotools"] == results["faster_coco_eval"]
    lines.append("The same values from both: " + ", ".join(KEYS) + "." if same
                 else f"The backends disagree: {results}")
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
