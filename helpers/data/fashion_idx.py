"""An offline stand-in for FashionMNIST, written in the real IDX format.

Notebook 06 reads FashionMNIST with torchvision's own loader, `torchvision.datasets.FashionMNIST(root,
download=False)`, which expects `<root>/FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`.
Nothing can be downloaded here, so this module draws 28×28 grey images of ten garment silhouettes (the
FashionMNIST classes, in its label order) and writes them in exactly that layout and format. Pointing
`data_path` at a folder holding the real files instead changes nothing in the notebook's code.

The drawings vary in position, size, proportions, brightness, texture and noise, and some classes are
close relatives as in the real data set (T-shirt / pullover / coat / shirt; sneaker / ankle boot), so
a model has to learn shapes: chance is 10 %, a small CNN reaches about 90 %.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from helpers.data.builds import reuse_or_build
from helpers.paths import cache_dir

CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
           "Ankle boot")
SIZE = 28
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_VERSION = 1


def _box(yy: np.ndarray, xx: np.ndarray, top: float, bottom: float, left: float, right: float) -> np.ndarray:
    return (yy >= top) & (yy <= bottom) & (xx >= left) & (xx <= right)


def _garment(label: int, rng: np.random.Generator) -> np.ndarray:
    """A silhouette of class `label` on a unit canvas in [-1, 1]², with random proportions."""
    grid = np.linspace(-1.0, 1.0, SIZE)
    # Random placement and scale: the model must not rely on exact pixel positions.
    scale = rng.uniform(0.7, 1.1)
    dy, dx = rng.uniform(-0.25, 0.25, size=2)
    yy, xx = np.meshgrid((grid - dy) / scale, (grid - dx) / scale, indexing="ij")
    w = rng.uniform(0.85, 1.15)  # width jitter
    if label in (0, 2, 4, 6):  # tops: a torso and sleeves, told apart by sleeve length, length and details
        body_bottom = {0: 0.55, 2: 0.6, 4: 0.85, 6: 0.6}[label] + rng.uniform(-0.08, 0.08)
        torso = _box(yy, xx, -0.6, body_bottom, -0.42 * w, 0.42 * w)
        sleeve_end = {0: -0.2, 2: 0.5, 4: 0.6, 6: 0.45}[label] + rng.uniform(-0.1, 0.1)
        arm = (np.abs(xx) > 0.42 * w) & (np.abs(xx) < 0.42 * w + 0.25) & (yy >= -0.6) & (yy <= sleeve_end)
        if label == 0:  # short sleeves flare outwards
            flare = 0.42 * w + 0.3 + 0.5 * (yy + 0.6)
            arm = (np.abs(xx) > 0.42 * w) & (np.abs(xx) < flare) & (yy >= -0.6) & (yy <= sleeve_end)
        mask = (torso | arm).astype(np.float32)
        if label == 4:  # a coat: darker opening down the middle, pockets
            mask[np.abs(xx) < 0.05] *= 0.35
            left_pocket = _box(yy, xx, 0.35, 0.45, -0.35 * w, -0.15 * w)
            mask[left_pocket | _box(yy, xx, 0.35, 0.45, 0.15 * w, 0.35 * w)] *= 0.5
        if label == 6:  # a shirt: a collar notch and a button line
            mask[(yy < -0.35) & (np.abs(xx) < 0.25 - 0.6 * (yy + 0.6))] = 0.0
            mask[(np.abs(xx) < 0.03) & (yy > -0.35)] *= 0.5
        if label == 2:  # a pullover: ribbed hem
            mask[(yy > body_bottom - 0.12) & (yy <= body_bottom) & torso] *= 0.7
        return mask
    if label == 1:  # trousers: two legs from a waistband
        gap = rng.uniform(0.04, 0.12)
        waist = _box(yy, xx, -0.8, -0.55, -0.4 * w, 0.4 * w)
        legs = (yy > -0.55) & (yy < 0.9) & (np.abs(xx) > gap) & (np.abs(xx) < 0.4 * w + 0.05 * (yy + 0.55))
        return (waist | legs).astype(np.float32)
    if label == 3:  # a dress: narrow top widening downwards
        half = 0.2 * w + 0.35 * w * (yy + 0.8)
        return ((yy > -0.8) & (yy < 0.9) & (np.abs(xx) < half)).astype(np.float32)
    if label == 5:  # a sandal: thin straps over a sole
        sole = _box(yy, xx, 0.3, 0.42, -0.85, 0.85)
        phase = rng.uniform(0, np.pi)
        straps = (yy > -0.2) & (yy < 0.3) & (np.abs(xx) < 0.8) & (np.sin(9 * xx + phase) > 0.55)
        return (sole | straps).astype(np.float32) * rng.uniform(0.7, 1.0)
    if label == 7:  # a sneaker: a low shoe, toe to the left, sloping up to the heel
        top = 0.1 - 0.35 * (xx + 0.9) / 1.8 * rng.uniform(0.8, 1.2)
        shoe = (yy > top) & (yy < 0.4) & (np.abs(xx) < 0.9)
        mask = shoe.astype(np.float32)
        mask[(yy > 0.3) & shoe] = 0.5  # the sole
        return mask
    if label == 8:  # a bag: a box with a handle
        body = _box(yy, xx, -0.2, 0.7, -0.7 * w, 0.7 * w)
        radius = np.sqrt(xx**2 + (yy + 0.2) ** 2)
        handle = (radius > 0.35) & (radius < 0.47) & (yy < -0.2)
        return (body | handle).astype(np.float32)
    # 9, an ankle boot: a shaft and a foot (an L), taller than a sneaker
    shaft = _box(yy, xx, -0.7, 0.4, 0.1, 0.75)
    foot = _box(yy, xx, 0.05, 0.4, -0.85, 0.75)
    mask = (shaft | foot).astype(np.float32)
    mask[(yy > 0.3) & (shaft | foot)] = 0.5
    return mask


def make_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` images (uint8, n×28×28) and labels (uint8), classes balanced and shuffled, from `seed`."""
    rng = np.random.default_rng(seed)
    labels = np.resize(np.arange(len(CLASSES), dtype=np.uint8), n)
    rng.shuffle(labels)
    images = np.empty((n, SIZE, SIZE), dtype=np.uint8)
    for i, label in enumerate(labels):
        mask = _garment(int(label), rng)
        brightness = rng.uniform(0.35, 1.0)
        texture = 1.0 - 0.4 * rng.random((SIZE, SIZE))
        pixels = mask * brightness * texture + rng.normal(0.0, 0.12, (SIZE, SIZE))
        images[i] = np.clip(pixels * 255.0, 0, 255).astype(np.uint8)
    return images, labels


def write_idx_images(path: Path, images: np.ndarray) -> None:
    """IDX3: magic 0x00000803 (unsigned bytes, 3 dimensions), big-endian sizes, then the pixels."""
    with open(path, "wb") as f:
        f.write(struct.pack(">IIII", 0x00000803, *images.shape))
        f.write(np.ascontiguousarray(images, dtype=np.uint8).tobytes())


def write_idx_labels(path: Path, labels: np.ndarray) -> None:
    """IDX1: magic 0x00000801 (unsigned bytes, 1 dimension), the count, then the labels."""
    with open(path, "wb") as f:
        f.write(struct.pack(">II", 0x00000801, len(labels)))
        f.write(np.ascontiguousarray(labels, dtype=np.uint8).tobytes())


def build(root: str | Path | None = None, train_size: int = 6000, test_size: int = 1000,
          seed: int = 0) -> Path:
    """Write the data set under `root` (default: the cache) and return `root`, the folder to pass to
    `torchvision.datasets.FashionMNIST(root, download=False)`.

    A manifest records the build arguments: an identical build already on disk is reused as is.
    """
    for name, value in (("train_size", train_size), ("test_size", test_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < len(CLASSES):
            raise ValueError(
                f"{name}={value!r} must be a whole number >= {len(CLASSES)} (one image per class).")
    root = Path(root) if root is not None else cache_dir("fashion_idx")
    raw = root / "FashionMNIST" / "raw"
    wanted = {"version": _VERSION, "train_size": train_size, "test_size": test_size, "seed": seed}

    def write() -> None:
        for split, n, split_seed in (("train", train_size, seed), ("test", test_size, seed + 1_000_003)):
            images, labels = make_images(n, split_seed)
            image_file, label_file = _FILES[split]
            write_idx_images(raw / image_file, images)
            write_idx_labels(raw / label_file, labels)

    reuse_or_build(raw, wanted, [raw / name for pair in _FILES.values() for name in pair], write)
    return root


def idx_count(path: str | Path) -> int:
    """The number of items an IDX file holds (its header's first size), without reading the items."""
    with open(path, "rb") as f:
        header = f.read(8)
    if len(header) < 8 or header[:2] != b"\x00\x00":
        raise ValueError(f"{path} is not an IDX file (no IDX header)")
    return struct.unpack(">I", header[4:8])[0]


def locate(data_path: str | Path | None, train_images: int, test_images: int) -> Path:
    """The folder to pass to `torchvision.datasets.FashionMNIST(root, download=False)`.

    `data_path` must hold the four unzipped FashionMNIST IDX files in `FashionMNIST/raw/`, with at least
    `train_images` training and `test_images` test images (what the notebook asks for). With None, the
    offline stand-in is built in the cache (at least 6,000 / 1,000 images, seed 0) and that folder returned.
    """
    if data_path is None:
        return build(train_size=max(6000, train_images), test_size=max(1000, test_images), seed=0)
    root = Path(data_path)
    raw = root / "FashionMNIST" / "raw"
    if not (raw / _FILES["train"][0]).exists():
        raise FileNotFoundError(
            f"data_path={str(data_path)!r} has no FashionMNIST/raw/{_FILES['train'][0]}: put the four "
            "unzipped FashionMNIST IDX files in <data_path>/FashionMNIST/raw/, or set data_path=None for the "
            "offline set.")
    for split, wanted, names in (("train", train_images, "n_train + n_val"), ("test", test_images, "n_test")):
        have = idx_count(raw / _FILES[split][0])
        if wanted > have:
            raise ValueError(f"{names} = {wanted} exceeds the {have:,} {split} images in {data_path}: lower "
                             "it.")
    return root


def show_examples(images: np.ndarray, labels: np.ndarray, per_class: int = 2) -> None:
    """A grid of `per_class` images of each class, titled by class."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(per_class, len(CLASSES), figsize=(10, 1.15 * per_class), squeeze=False)
    for c in range(len(CLASSES)):
        for row, i in enumerate(np.flatnonzero(labels == c)[:per_class]):
            axes[row, c].imshow(images[i], cmap="gray_r")
        for row in range(per_class):
            axes[row, c].axis("off")
        axes[0, c].set_title(CLASSES[c], fontsize=7)
    plt.tight_layout()
    plt.show()


def show_predictions(images: np.ndarray, labels: np.ndarray, predictions: np.ndarray,
                     shown: int = 12) -> None:
    """The confusion matrix of `predictions` against `labels`, and the first `shown` images titled with their
    predicted class (green: right, red: wrong)."""
    import matplotlib.pyplot as plt
    from sklearn.metrics import confusion_matrix

    matrix = confusion_matrix(labels, predictions, labels=range(len(CLASSES)))
    accuracy = float((predictions == labels).mean())
    fig, (ax_cm, ax_img) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [1.2, 1]})
    ax_cm.imshow(matrix, cmap="Blues")
    for (i, j), n in np.ndenumerate(matrix):
        if n:
            ax_cm.text(j, i, n, ha="center", va="center", fontsize=7,
                       color="white" if n > matrix.max() / 2 else "black")
    ax_cm.set_xticks(range(len(CLASSES)), CLASSES, rotation=60, fontsize=7)
    ax_cm.set_yticks(range(len(CLASSES)), CLASSES, fontsize=7)
    ax_cm.set_xlabel("predicted")
    ax_cm.set_ylabel("true")
    ax_cm.set_title(f"test accuracy {accuracy:.3f}")
    ax_img.axis("off")
    for k in range(min(shown, len(images))):
        sub = ax_img.inset_axes([(k % 4) / 4, 1 - (k // 4 + 1) / 3, 0.23, 0.3])
        sub.imshow(images[k], cmap="gray_r")
        sub.axis("off")
        right = predictions[k] == labels[k]
        sub.set_title(CLASSES[predictions[k]], fontsize=7, color="green" if right else "red")
    plt.tight_layout()
    plt.show()

