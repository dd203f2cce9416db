"""The offline COCO-format shapes data set: real COCO format, exact boxes, deterministic, validated."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from pathlib import Path

import pytest

from helpers.data.coco_shapes import CATEGORIES, build_coco_shapes, check_coco_detection, read_coco_folder

SMALL = dict(n_train=12, n_val=6, seed=3)


def _digest(root: Path) -> str:
    """One hash over every file the builder wrote (names and bytes)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_coco_shapes(tmp_path_factory.mktemp("shapes"), **SMALL)


def test_pycocotools_reads_it_and_boxes_are_valid(built):
    from PIL import Image
    from pycocotools.coco import COCO

    for images, ann_json in ((built.train_images, built.train_annotations),
                             (built.val_images, built.val_annotations)):
        with contextlib.redirect_stdout(io.StringIO()):
            coco = COCO(str(ann_json))
        assert sorted(coco.getCatIds()) == list(range(1, len(CATEGORIES) + 1))
        assert {c["name"] for c in coco.loadCats(coco.getCatIds())} == {name for name, _ in CATEGORIES}
        assert coco.getAnnIds(), "no annotations"
        for image_id in coco.getImgIds():
            info = coco.loadImgs(image_id)[0]
            with Image.open(images / info["file_name"]) as im:
                assert im.size == (info["width"], info["height"]) and im.mode == "RGB"
            anns = coco.loadAnns(coco.getAnnIds(imgIds=image_id))
            assert 1 <= len(anns) <= 4
            for ann in anns:
                x, y, w, h = ann["bbox"]
                assert w > 0 and h > 0
                assert 0 <= x and 0 <= y and x + w <= info["width"] and y + h <= info["height"]
                assert ann["category_id"] in coco.cats and ann["iscrowd"] == 0 and 0 < ann["area"] <= w * h
    assert check_coco_detection(built.train_images, built.train_annotations)["images"] == SMALL["n_train"]


def test_torchvision_coco_loader_reads_it(built):
    """The notebook's loading path: CocoDetection wrapped for the v2 transforms gives XYXY boxes and
    labels."""
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    with contextlib.redirect_stdout(io.StringIO()):
        coco = CocoDetection(str(built.val_images), str(built.val_annotations))
        dataset = wrap_dataset_for_transforms_v2(coco)
    image, target = dataset[0]
    raw = json.loads(built.val_annotations.read_text())
    first = [a for a in raw["annotations"] if a["image_id"] == raw["images"][0]["id"]]
    assert target["labels"].tolist() == [a["category_id"] for a in first]
    x, y, w, h = first[0]["bbox"]
    assert target["boxes"][0].tolist() == [x, y, x + w, y + h]


def test_same_seed_same_bytes_and_reuse(tmp_path, built):
    again = build_coco_shapes(tmp_path / "again", **SMALL)
    assert _digest(again.root) == _digest(built.root)
    other = build_coco_shapes(tmp_path / "other", **dict(SMALL, seed=4))
    assert _digest(other.root) != _digest(built.root)
    # An identical build is reused (nothing rewritten); different arguments rebuild in place.
    stamp = again.train_annotations.stat().st_mtime_ns
    build_coco_shapes(tmp_path / "again", **SMALL)
    assert again.train_annotations.stat().st_mtime_ns == stamp
    rebuilt = build_coco_shapes(tmp_path / "again", **dict(SMALL, n_train=5))
    assert len(list(rebuilt.train_images.glob("*.png"))) == 5
    # The validation split does not depend on the size of the training split.
    assert rebuilt.val_annotations.read_bytes() == built.val_annotations.read_bytes()


def _copy(built, tmp_path) -> tuple[Path, Path, dict]:
    import shutil

    images = tmp_path / "images"
    shutil.copytree(built.val_images, images)
    coco = json.loads(built.val_annotations.read_text())
    return images, tmp_path / "instances.json", coco


def test_missing_annotations_file(tmp_path, built):
    with pytest.raises(FileNotFoundError, match="nope.json' does not exist.*its instances JSON"):
        check_coco_detection(built.val_images, tmp_path / "nope.json")


def test_image_listed_but_absent(tmp_path, built):
    images, annotations, coco = _copy(built, tmp_path)
    annotations.write_text(json.dumps(coco))
    (images / coco["images"][2]["file_name"]).unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of the 6 images .* missing .*val_00002\.png"):
        check_coco_detection(images, annotations)


def test_degenerate_box(tmp_path, built):
    images, annotations, coco = _copy(built, tmp_path)
    coco["annotations"][1]["bbox"][3] = 0
    annotations.write_text(json.dumps(coco))
    with pytest.raises(ValueError, match=r"annotation id=2 .* degenerate box .* fix or delete"):
        check_coco_detection(images, annotations)


def test_box_outside_image_and_unknown_category(tmp_path, built):
    images, annotations, coco = _copy(built, tmp_path)
    coco["annotations"][0]["bbox"][0] = 90.0
    annotations.write_text(json.dumps(coco))
    with pytest.raises(ValueError, match="outside its 96x96 image"):
        check_coco_detection(images, annotations)
    coco = json.loads(built.val_annotations.read_text())
    coco["annotations"][0]["category_id"] = 99
    annotations.write_text(json.dumps(coco))
    with pytest.raises(ValueError, match="category_id=99"):
        check_coco_detection(images, annotations)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="the shapes must fit inside"):
        build_coco_shapes(tmp_path, image_size=32, max_size=40)


def test_coco_sized_jpegs(tmp_path):
    """The stand-in for COCO itself: 640 x 480 JPEGs, read by the same loader, boxes inside the images."""
    import json

    from PIL import Image

    shapes = build_coco_shapes(tmp_path / "coco", n_train=3, n_val=1, image_size=640, image_height=480,
                               image_format="jpg", min_size=40, max_size=200)
    files = sorted(shapes.train_images.iterdir())
    assert [f.suffix for f in files] == [".jpg"] * 3 and Image.open(files[0]).size == (640, 480)
    coco = json.loads(shapes.train_annotations.read_text())
    assert {(i["width"], i["height"]) for i in coco["images"]} == {(640, 480)}
    for a in coco["annotations"]:
        x, y, w, h = a["bbox"]
        assert 0 <= x and x + w <= 640 and 0 <= y and y + h <= 480
    assert check_coco_detection(shapes.train_images, shapes.train_annotations)["images"] == 3
    with pytest.raises(ValueError, match="image_format='tiff'"):
        build_coco_shapes(tmp_path / "bad", image_format="tiff")


def test_written_as_coco_2017_lays_it_out_and_read_back(built):
    """The layout COCO 2017 ships in; read_coco_folder finds both splits in it and checks them."""
    root = built.root
    annotations = root / "annotations"
    assert built.train_images == root / "train2017" and built.val_images == root / "val2017"
    assert built.train_annotations == annotations / "instances_train2017.json"
    assert built.val_annotations == annotations / "instances_val2017.json"
    coco = read_coco_folder(str(root))
    assert coco.splits == {"train": (built.train_images, built.train_annotations),
                           "val": (built.val_images, built.val_annotations)}
    assert coco.categories == built.categories and coco.num_classes == len(CATEGORIES) + 1
    assert coco.describe().splitlines()[:2] == [
        f"train: {SMALL['n_train']} images, {coco.summaries['train']['annotations']} boxes",
        f"val: {SMALL['n_val']} images, {coco.summaries['val']['annotations']} boxes"]


def test_a_folder_not_laid_out_as_coco_is_refused(tmp_path, built):
    import shutil

    with pytest.raises(FileNotFoundError, match="is not a folder"):
        read_coco_folder(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"instances_train\*.json .* annotations/ holds no folder"):
        read_coco_folder(tmp_path)
    root = tmp_path / "coco2014"   # another year's names work as long as folder and JSON agree
    shutil.copytree(built.root, root)
    for split in ("train", "val"):
        (root / f"{split}2017").rename(root / f"{split}2014")
        (root / "annotations" / f"instances_{split}2017.json").rename(
            root / "annotations" / f"instances_{split}2014.json")
    assert read_coco_folder(root).splits["val"][0] == root / "val2014"
    (root / "val2014").rename(root / "val")   # the JSON's folder is missing
    with pytest.raises(FileNotFoundError, match="val2014' is not a folder"):
        read_coco_folder(root)
    (root / "val").rename(root / "val2014")
    coco = json.loads((root / "annotations" / "instances_val2014.json").read_text())
    coco["categories"][0]["name"] = "disc"
    (root / "annotations" / "instances_val2014.json").write_text(json.dumps(coco))
    with pytest.raises(ValueError, match="list different categories"):
        read_coco_folder(root)
