"""An offline object-detection data set in COCO format: coloured shapes on textured backgrounds.

Notebook 02 trains torchvision's RetinaNet with the loading code one uses for COCO itself
(`torchvision.datasets.CocoDetection` + `wrap_dataset_for_transforms_v2`). Nothing can be downloaded here,
so this module writes a small data set in exactly that format and layout, the one COCO 2017 ships in
(`train2017/`, `val2017/`, `annotations/instances_{train,val}2017.json`), that the same code reads
unchanged. Pointing the notebook at COCO, or at any COCO-format export laid out the same way (CVAT, Label
Studio, Roboflow...), is then a matter of one path: `read_coco_folder` finds the splits in it.

Why it looks the way it does:

* several classes that differ in form *and* colour, several objects per image, of different sizes, some
  overlapping, on a textured background: an untrained detector scores near zero on it, while a small
  detector trained from scratch for a minute on two CPU cores learns it (the task must be learnable in the
  notebook's smoke run, otherwise its checks cannot tell a working pipeline from a broken one);
* deterministic from a seed, down to the bytes, so stored notebook outputs can be compared on re-execution;
* a manifest with the build arguments, so a second build with the same arguments costs nothing.

`check_coco_detection` validates any COCO-format split in the kernel before a launch, so a missing file or a
degenerate box fails in seconds with a message that says what to fix, not minutes later on some rank.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.data.builds import reuse_or_build
from helpers.paths import cache_dir

#: The classes: (name, RGB colour). Form and colour both differ, so either cue identifies the class.
CATEGORIES: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("circle", (220, 40, 40)),
    ("square", (40, 90, 230)),
    ("triangle", (30, 170, 60)),
    ("cross", (235, 200, 30)),
)

_FORMAT_VERSION = 2  # bump when the drawing or the layout changes, so old caches are rebuilt
SPLITS = ("train", "val")
SPLIT_YEAR = "2017"  # COCO 2017's names: train2017/, annotations/instances_train2017.json


@dataclass(frozen=True)
class CocoShapes:
    """Where a built data set lies: one image folder and one instances JSON per split."""

    root: Path
    train_images: Path
    train_annotations: Path
    val_images: Path
    val_annotations: Path
    categories: dict[int, str]


def _background(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A muted texture: smooth blotches plus faint stripes and pixel noise, never a flat colour."""
    cells = max(width, height) // 16 + 2
    coarse = rng.uniform(0, 1, size=(cells, cells, 3))
    # Bilinear up-sampling of a coarse grid gives smooth blotches without scipy.
    ys, xs = (np.linspace(0, cells - 1.001, n) for n in (height, width))
    iy, ix = ys.astype(int), xs.astype(int)
    fy, fx = (ys - iy)[:, None, None], (xs - ix)[None, :, None]
    rows = coarse[iy] * (1 - fy) + coarse[iy + 1] * fy
    blotches = rows[:, ix] * (1 - fx) + rows[:, ix + 1] * fx
    angle = rng.uniform(0, math.pi)
    period = rng.uniform(6, 14)
    yy, xx = np.mgrid[0:height, 0:width]
    stripes = np.sin((xx * math.cos(angle) + yy * math.sin(angle)) * 2 * math.pi / period)[:, :, None]
    base = rng.uniform(90, 170)
    image = base + 45 * (blotches - 0.5) + 12 * stripes + rng.normal(0, 6, size=(height, width, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def _shape_mask(kind: str, cx: float, cy: float, r: float, angle: float, size: tuple[int, int]):
    """A binary PIL mask of one shape (`r` is its half-extent); its bounding box is the COCO box."""
    from PIL import Image, ImageDraw

    mask = Image.new("L", size, 0)
    draw = ImageDraw.Draw(mask)
    if kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    elif kind == "square":
        s = r * 0.85
        draw.rectangle([cx - s, cy - s, cx + s, cy + s], fill=255)
    elif kind == "triangle":
        pts = [(cx + r * math.cos(angle + k * 2 * math.pi / 3),
                cy + r * math.sin(angle + k * 2 * math.pi / 3)) for k in range(3)]
        draw.polygon(pts, fill=255)
    elif kind == "cross":
        t = r * 0.32
        draw.rectangle([cx - r, cy - t, cx + r, cy + t], fill=255)
        draw.rectangle([cx - t, cy - r, cx + t, cy + r], fill=255)
    else:  # pragma: no cover - CATEGORIES and this function change together
        raise ValueError(kind)
    return mask


def _covered(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    """The share of the smaller box that the two boxes have in common (0: apart, 1: one inside the other)."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return ix * iy / smaller if smaller > 0 else 0.0


def _write_split(folder: Path, json_path: Path, split: str, n_images: int, image_size: int,
                 image_height: int, image_format: str, max_objects: int, min_size: int, max_size: int,
                 max_overlap: float, rng: np.random.Generator) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for index in range(n_images):
        canvas = Image.fromarray(_background(rng, image_size, image_height))
        placed: list[tuple[float, float, float, float]] = []
        for _ in range(int(rng.integers(1, max_objects + 1))):
            for _attempt in range(20):  # rejection sampling: some overlap, never hidden objects
                cat = int(rng.integers(len(CATEGORIES)))
                r = float(rng.uniform(min_size, max_size)) / 2
                cx = float(rng.uniform(r + 1, image_size - r - 1))
                cy = float(rng.uniform(r + 1, image_height - r - 1))
                box = (cx - r, cy - r, cx + r, cy + r)
                if all(_covered(box, other) <= max_overlap for other in placed):
                    break
            else:
                continue
            mask = _shape_mask(CATEGORIES[cat][0], cx, cy, r, float(rng.uniform(0, 2 * math.pi)),
                               (image_size, image_height))
            left, top, right, bottom = mask.getbbox()  # exact pixel extent of what was drawn
            colour = tuple(int(np.clip(c + rng.integers(-20, 21), 0, 255)) for c in CATEGORIES[cat][1])
            canvas.paste(Image.new("RGB", canvas.size, colour), mask=mask)
            placed.append(box)
            annotations.append({
                "id": len(annotations) + 1, "image_id": index + 1, "category_id": cat + 1,
                "bbox": [left, top, right - left, bottom - top],
                "area": int(np.count_nonzero(np.asarray(mask))), "iscrowd": 0,
            })
        name = f"{split}_{index:05d}.{image_format}"
        if image_format == "png":
            canvas.save(folder / name, format="PNG", optimize=False, compress_level=6)
        else:   # COCO's own images are JPEGs
            canvas.save(folder / name, format="JPEG", quality=90)
        images.append({"id": index + 1, "file_name": name, "width": image_size, "height": image_height})
    coco = {
        "info": {"description": f"coco_shapes {split} split (helpers.data.coco_shapes)", "version": "1"},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": name, "supercategory": "shape"}
                       for i, (name, _) in enumerate(CATEGORIES)],
    }
    json_path.write_text(json.dumps(coco, indent=1, sort_keys=True))


def build_coco_shapes(root: str | Path | None = None, *, n_train: int = 320, n_val: int = 64,
                      image_size: int = 96, image_height: int | None = None, image_format: str = "png",
                      max_objects: int = 4, min_size: int = 16, max_size: int = 40, max_overlap: float = 0.3,
                      seed: int = 0) -> CocoShapes:
    """Write (or reuse) the shapes data set under `root` and say where its parts are.

    Layout, the one COCO 2017 uses: `train2017/`, `val2017/` image folders and
    `annotations/instances_{train,val}2017.json` (`read_coco_folder(root)` reads it back).
    Boxes are `[x, y, width, height]` in pixels, the exact extent of the drawn shape; category ids start at 1.
    `max_overlap` is the largest share of the smaller of two objects' boxes that they may have in common, so
    objects overlap but are never hidden. `image_size` is the width, `image_height` the height (None: square;
    640 x 480 is COCO's usual shape), `image_format` "png" or "jpg" (COCO's own).
    Same arguments, same bytes; a folder already holding this exact build is reused, a different one is
    replaced (only inside `root`, which defaults to the git-ignored data cache).
    """
    if n_train < 1 or n_val < 1:
        raise ValueError(f"n_train={n_train} and n_val={n_val} must both be at least 1.")
    image_height = image_size if image_height is None else image_height
    if not (4 <= min_size <= max_size <= min(image_size, image_height) - 4):
        raise ValueError(f"need 4 <= min_size ({min_size}) <= max_size ({max_size}) <= the image's shorter "
                         f"side - 4 ({min(image_size, image_height) - 4}): the shapes must fit inside.")
    if image_format not in ("png", "jpg"):
        raise ValueError(f"image_format={image_format!r}: use 'png' or 'jpg'.")
    if max_objects < 1:
        raise ValueError(f"max_objects={max_objects} must be at least 1.")
    args = {"n_train": n_train, "n_val": n_val, "image_size": image_size, "max_objects": max_objects,
            **({"image_height": image_height, "image_format": image_format}   # older builds stay valid
               if (image_height, image_format) != (image_size, "png") else {}),
            "min_size": min_size, "max_size": max_size, "max_overlap": max_overlap, "seed": seed,
            "format_version": _FORMAT_VERSION}
    shape = f"{image_size}px" if image_height == image_size else f"{image_size}x{image_height}px"
    root = Path(root) if root is not None else cache_dir("coco_shapes", f"seed{seed}-{shape}-{image_format}"
                                                          if image_format != "png" else f"seed{seed}-{shape}")
    result = CocoShapes(
        root=root,
        train_images=root / f"train{SPLIT_YEAR}",
        train_annotations=root / "annotations" / f"instances_train{SPLIT_YEAR}.json",
        val_images=root / f"val{SPLIT_YEAR}",
        val_annotations=root / "annotations" / f"instances_val{SPLIT_YEAR}.json",
        categories={i + 1: name for i, (name, _) in enumerate(CATEGORIES)},
    )
    # One generator per split, so the validation set does not change when n_train does.
    train_rng, val_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    common = dict(image_size=image_size, image_height=image_height, image_format=image_format,
                  max_objects=max_objects, min_size=min_size, max_size=max_size, max_overlap=max_overlap)

    def write() -> None:
        (root / "annotations").mkdir(parents=True, exist_ok=True)
        _write_split(result.train_images, result.train_annotations, "train", n_train, rng=train_rng, **common)
        _write_split(result.val_images, result.val_annotations, "val", n_val, rng=val_rng, **common)

    # A stale or partial build: only what this builder writes is replaced.
    reuse_or_build(root, args, [result.train_images, result.val_images, root / "annotations"], write)
    return result


def check_coco_detection(images_dir: str | Path, annotations_json: str | Path,
                         tolerance: float = 1.0) -> dict[str, Any]:
    """Validate a COCO-format detection data set before training on it; return a short summary.

    Raises FileNotFoundError or ValueError with a message naming the file, image or annotation at fault
    and how to fix it. Checks: the JSON exists and has `images`, `annotations` and `categories`; every
    image the JSON lists exists in `images_dir`; every annotation refers to a known image and category,
    and its box `[x, y, w, h]` has positive width and height and lies inside its image (within
    `tolerance` pixels, as real exports round coordinates). Crowd annotations (`iscrowd: 1`) are not
    checked for size: detection training ignores them.
    """
    images_dir, annotations_json = Path(images_dir), Path(annotations_json)
    coco = _read_instances(images_dir, annotations_json)
    images = {img["id"]: img for img in coco["images"]}
    absent = [img["file_name"] for img in coco["images"] if not (images_dir / img["file_name"]).is_file()]
    if absent:
        raise FileNotFoundError(
            f"{len(absent)} of the {len(images)} images listed in {annotations_json.name} are missing from "
            f"{images_dir}, for example {absent[:3]}: copy them there, or remove their entries (and "
            f"annotations) from the JSON.")
    categories = {c["id"] for c in coco["categories"]}
    for ann in coco["annotations"]:
        _check_annotation(ann, images, categories, annotations_json.name, tolerance)
    return {"images": len(images), "annotations": len(coco["annotations"]),
            "categories": {c["id"]: c["name"] for c in coco["categories"]}}


def _read_instances(images_dir: Path, annotations_json: Path) -> dict[str, Any]:
    """The instances JSON, with the lists a detector needs."""
    if not annotations_json.is_file():
        raise FileNotFoundError(
            f"{str(annotations_json)!r} does not exist: a COCO-format split needs its instances JSON "
            f"(such as annotations/instances_val2017.json).")
    if not images_dir.is_dir():
        raise FileNotFoundError(
            f"{str(images_dir)!r} is not a folder: a COCO-format split needs the folder holding the images "
            f"that {annotations_json.name} lists (their `file_name` is relative to it).")
    try:
        coco = json.loads(annotations_json.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{annotations_json} is not valid JSON ({e}): export it again in COCO format.") from e
    missing_keys = [k for k in ("images", "annotations", "categories") if k not in coco]
    if missing_keys:
        raise ValueError(f"{annotations_json} has no {missing_keys} list(s): it is not a COCO instances file "
                         f"(expected keys 'images', 'annotations', 'categories').")
    if not coco["categories"]:
        raise ValueError(f"{annotations_json} lists no categories: a detector needs at least one class.")
    return coco


def _check_annotation(ann: dict[str, Any], images: dict[Any, dict[str, Any]], categories: set[Any],
                      source: str, tolerance: float) -> None:
    """One annotation: a known image and category, and (unless a crowd) a box of positive size inside its
    image, within `tolerance` pixels."""
    where = f"annotation id={ann.get('id')} (image_id={ann.get('image_id')}) in {source}"
    image = images.get(ann.get("image_id"))
    if image is None:
        raise ValueError(f"{where} refers to an image id the JSON does not list.")
    if ann.get("category_id") not in categories:
        raise ValueError(f"{where} has category_id={ann.get('category_id')}, "
                         f"not one of the JSON's categories {sorted(categories)}.")
    bbox = ann.get("bbox")
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
        raise ValueError(f"{where} has bbox={bbox!r}: COCO boxes are four numbers [x, y, width, height].")
    if ann.get("iscrowd", 0):
        return
    x, y, w, h = bbox
    if w <= 0 or h <= 0 or not all(math.isfinite(v) for v in bbox):
        raise ValueError(
            f"{where} has a degenerate box {bbox} (width and height must be positive; image "
            f"{image['file_name']!r}): fix or delete that annotation. Such a box makes the detector's "
            f"box-regression targets infinite.")
    width, height = image.get("width"), image.get("height")
    if width is not None and height is not None and (
            x < -tolerance or y < -tolerance or x + w > width + tolerance or y + h > height + tolerance):
        raise ValueError(
            f"{where} has box {bbox} outside its {width}x{height} image {image['file_name']!r}: clip it "
            f"to the image or fix the export.")



@dataclass(frozen=True)
class CocoFolder:
    """A COCO-layout folder's training and validation splits, checked, and the categories they share."""

    root: Path
    splits: dict[str, tuple[Path, Path]]   # "train" / "val" -> (image folder, instances JSON)
    categories: dict[int, str]             # category id -> name
    summaries: dict[str, dict[str, Any]]   # "train" / "val" -> check_coco_detection's summary

    @property
    def num_classes(self) -> int:
        """The classifier's width in torchvision's detectors: logits are indexed by category id (0 unused)."""
        return max(self.categories) + 1

    def describe(self) -> str:
        """A few lines for the notebook: images and boxes per split, the categories."""
        lines = [f"{name}: {s['images']} images, {s['annotations']} boxes"
                 for name, s in self.summaries.items()]
        return "\n".join([*lines, f"categories: {self.categories}"])


def _split_of(root: Path, split: str) -> tuple[Path, Path]:
    """`annotations/instances_<split>*.json` and the image folder of the same name (`<split>2017/`)."""
    annotations = root / "annotations"
    found = sorted(annotations.glob(f"instances_{split}*.json"))
    if len(found) != 1:
        listed = sorted(p.name for p in annotations.glob("*.json")) if annotations.is_dir() else "no folder"
        raise FileNotFoundError(
            f"data_path={str(root)!r} should be laid out as COCO is, with one "
            f"annotations/instances_{split}*.json (such as instances_{split}{SPLIT_YEAR}.json) beside its "
            f"image folder ({split}{SPLIT_YEAR}/); "
            f"annotations/ holds {listed}. Or set data_path=None to use the built-in shapes data set.")
    return root / found[0].stem.removeprefix("instances_"), found[0]


def read_coco_folder(data_path: str | Path) -> CocoFolder:
    """The training and validation splits of a folder laid out as COCO 2017 ships (and `build_coco_shapes`
    writes): `annotations/instances_train2017.json` with `train2017/`, `annotations/instances_val2017.json`
    with `val2017/`; any suffix after the split's name (2014, say) as long as the image folder has the same
    name. Each split is checked with `check_coco_detection`; both must list the same categories.
    """
    root = Path(data_path)
    if not root.is_dir():
        raise FileNotFoundError(
            f"data_path={str(data_path)!r} is not a folder: point it at a COCO-layout folder (annotations/, "
            f"train{SPLIT_YEAR}/, val{SPLIT_YEAR}/), or set data_path=None for the built-in shapes data set.")
    splits = {split: _split_of(root, split) for split in SPLITS}
    summaries = {split: check_coco_detection(*paths) for split, paths in splits.items()}
    if summaries["train"]["categories"] != summaries["val"]["categories"]:
        raise ValueError(f"{splits['train'][1].name} and {splits['val'][1].name} list different categories: "
                         "export both splits together.")
    return CocoFolder(root, splits, summaries["train"]["categories"], summaries)
