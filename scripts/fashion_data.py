#!/usr/bin/env python3
"""Fashion-MNIST loading and preprocessing shared by mpq's training and benchmark scripts.

Reads the original idx files (gzip'd), as shipped by Debian's dataset-fashion-mnist package in
/usr/share/datasets/fashion-mnist/ (override with --root or $FASHION_MNIST_DIR):

    train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz   60,000 images
    t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz    10,000 images

Preprocessing (all in float32):  x = pixel / 255;  x = (x - 0.2860) / 0.3530
Layout: NCHW float32 [n, 1, 28, 28]; labels int64 [n] (0..9).

Library use:
    from fashion_data import load
    images, labels = load("test", count=1000)

CLI:
    python scripts/fashion_data.py --out DIR --split train|test --count N [--offset K]
                                   [--shuffle-seed S] [--labels]
writes DIR/images.npy (and DIR/labels.npy with --labels). With --shuffle-seed the split is first
permuted with numpy.random.default_rng(S).permutation, then --offset/--count select from it.
"""

import argparse
import gzip
import os
import sys

import numpy as np

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"
MEAN = 0.2860
STD = 0.3530
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def data_root(root=None):
    return root or os.environ.get("FASHION_MNIST_DIR") or DEFAULT_ROOT


def read_idx(path):
    """Read an idx file (optionally gzip'd): unsigned-byte data only, as Fashion-MNIST uses."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an idx file")
    dtype_code, ndim = data[2], data[3]
    if dtype_code != 0x08:
        raise ValueError(f"{path}: idx type 0x{dtype_code:02x} not supported (only unsigned byte)")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    count = int(np.prod(dims)) if dims else 0
    if len(data) - offset != count:
        raise ValueError(f"{path}: expected {count} bytes of data after the header, found {len(data) - offset}")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def load_raw(split, root=None):
    """uint8 images [n, 28, 28] and uint8 labels [n] of split 'train' or 'test'."""
    if split not in _FILES:
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    img_name, lab_name = _FILES[split]
    root = data_root(root)
    images = read_idx(os.path.join(root, img_name))
    labels = read_idx(os.path.join(root, lab_name))
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{root}: {images.shape[0]} images but {labels.shape[0]} labels for split {split}")
    return images, labels


def preprocess(images_u8):
    """uint8 [n, 28, 28] -> float32 [n, 1, 28, 28]: (x / 255 - 0.2860) / 0.3530, in float32."""
    x = images_u8.astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(MEAN)) / np.float32(STD)
    return np.ascontiguousarray(x[:, None, :, :], dtype=np.float32)


def select(n, count=None, offset=0, shuffle_seed=None):
    """Indices of the samples chosen: optional seeded permutation, then [offset, offset + count)."""
    order = np.arange(n) if shuffle_seed is None else np.random.default_rng(shuffle_seed).permutation(n)
    if offset < 0 or offset > n:
        raise ValueError(f"offset {offset} outside 0..{n}")
    end = n if count is None else offset + count
    if count is not None and (count < 0 or end > n):
        raise ValueError(f"offset {offset} + count {count} exceeds the {n} samples")
    return order[offset:end]


def load(split, count=None, offset=0, shuffle_seed=None, root=None):
    """Preprocessed images float32 [n, 1, 28, 28] and labels int64 [n]."""
    images, labels = load_raw(split, root)
    idx = select(images.shape[0], count, offset, shuffle_seed)
    return preprocess(images[idx]), labels[idx].astype(np.int64)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (created if missing)")
    ap.add_argument("--split", required=True, choices=["train", "test"])
    ap.add_argument("--count", type=int, default=None, help="number of images (default: all from offset)")
    ap.add_argument("--offset", type=int, default=0, help="first image taken (after any shuffle)")
    ap.add_argument("--shuffle-seed", type=int, default=None,
                    help="permute the split with numpy.random.default_rng(SEED) before selecting")
    ap.add_argument("--labels", action="store_true", help="also write labels.npy (int64)")
    ap.add_argument("--root", default=None, help=f"idx files folder (default $FASHION_MNIST_DIR or {DEFAULT_ROOT})")
    args = ap.parse_args(argv)
    try:
        images, labels = load(args.split, args.count, args.offset, args.shuffle_seed, args.root)
    except (OSError, ValueError) as e:
        print(f"fashion_data: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "images.npy"), images)
    wrote = [f"{os.path.join(args.out, 'images.npy')} {list(images.shape)} float32"]
    if args.labels:
        np.save(os.path.join(args.out, "labels.npy"), labels)
        wrote.append(f"{os.path.join(args.out, 'labels.npy')} {list(labels.shape)} int64")
    print("wrote " + "; ".join(wrote))
    return 0


if __name__ == "__main__":
    sys.exit(main())
