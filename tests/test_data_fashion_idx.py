"""The offline FashionMNIST stand-in: real IDX format, deterministic, cached, learnable."""

import struct

import numpy as np
import pytest

from helpers.data import fashion_idx


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return fashion_idx.build(tmp_path_factory.mktemp("fm"), train_size=1000, test_size=300, seed=3)


def test_torchvision_reads_it(root):
    import torchvision

    train = torchvision.datasets.FashionMNIST(root, train=True, download=False)
    test = torchvision.datasets.FashionMNIST(root, train=False, download=False)
    assert tuple(train.data.shape) == (1000, 28, 28) and tuple(test.data.shape) == (300, 28, 28)
    assert str(train.data.dtype) == "torch.uint8"
    assert train.classes[9] == fashion_idx.CLASSES[9] == "Ankle boot"
    assert np.bincount(train.targets.numpy(), minlength=10).tolist() == [100] * 10
    image, label = train[0]
    assert image.size == (28, 28) and 0 <= label < 10


def test_idx_headers(root):
    raw = root / "FashionMNIST" / "raw"
    magic, n, rows, cols = struct.unpack(">IIII", (raw / "train-images-idx3-ubyte").read_bytes()[:16])
    assert (magic, n, rows, cols) == (0x803, 1000, 28, 28)
    magic, n = struct.unpack(">II", (raw / "t10k-labels-idx1-ubyte").read_bytes()[:8])
    assert (magic, n) == (0x801, 300)
    assert (raw / "train-images-idx3-ubyte").stat().st_size == 16 + 1000 * 28 * 28


def test_deterministic_and_cached(root, tmp_path):
    raw = root / "FashionMNIST" / "raw"
    again = fashion_idx.build(tmp_path / "again", train_size=1000, test_size=300, seed=3)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"):
        assert (again / "FashionMNIST" / "raw" / name).read_bytes() == (raw / name).read_bytes()
    other = fashion_idx.build(tmp_path / "other", train_size=1000, test_size=300, seed=4)
    assert (other / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").read_bytes() != (
        raw / "train-images-idx3-ubyte").read_bytes()
    # An identical build is reused, not rewritten; a different one replaces it.
    before = (raw / "train-images-idx3-ubyte").stat().st_mtime_ns
    fashion_idx.build(root, train_size=1000, test_size=300, seed=3)
    assert (raw / "train-images-idx3-ubyte").stat().st_mtime_ns == before
    fashion_idx.build(tmp_path / "again", train_size=500, test_size=300, seed=3)
    images = tmp_path / "again" / "FashionMNIST" / "raw" / "train-images-idx3-ubyte"
    assert images.stat().st_size == 16 + 500 * 784


def test_learnable_but_not_trivial(root):
    """A linear model beats chance by far, yet is not perfect: there is something left for a CNN to learn."""
    import torchvision
    from sklearn.linear_model import LogisticRegression

    train = torchvision.datasets.FashionMNIST(root, train=True, download=False)
    test = torchvision.datasets.FashionMNIST(root, train=False, download=False)
    flat = lambda d: d.data.numpy().reshape(len(d), -1) / 255.0  # noqa: E731
    accuracy = LogisticRegression(max_iter=200).fit(flat(train), train.targets.numpy()).score(
        flat(test), test.targets.numpy())
    assert 0.5 < accuracy < 0.97, accuracy


@pytest.mark.parametrize("kwargs", [{"train_size": 5}, {"test_size": 2.5}, {"train_size": True}])
def test_bad_sizes(kwargs, tmp_path):
    with pytest.raises(ValueError, match="must be a whole number"):
        fashion_idx.build(tmp_path, **kwargs)
    assert not any(tmp_path.iterdir()), "nothing is written for a refused build"
