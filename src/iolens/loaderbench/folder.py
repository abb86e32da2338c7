"""The built-in dataset of ``--folder DIR``: a class-folder of files, each decoded to a tensor.

``DIR/CLASS/FILE`` gives the sample FILE the label of CLASS (classes in name
order); a folder without subfolders holds samples of one class. Hidden files
and folders are left out. Each sample's bytes are read whole and decoded:

- ``raw``: the first C*H*W bytes as an unsigned 8-bit C x H x W tensor scaled to
  [0, 1] (zeros pad a shorter file), as an image pipeline's decode would;
- ``image``: decoded with Pillow, converted to RGB (or grey for C=1) and resized
  to H x W, then scaled to [0, 1];
- ``auto``: ``image`` when the files carry image extensions, ``raw`` otherwise.
"""

from __future__ import annotations

import importlib.util
import io
import math
import os

import torch
from torch.utils.data import Dataset

from iolens.loaderbench.source import Source, SpecError

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif",
                              ".tiff"})
DECODERS = ("auto", "raw", "image")


def scan(root: str) -> list[tuple[str, int]]:
    """``(path, label)`` of every sample file under ``root``, in a stable order."""
    if not os.path.isdir(root):
        raise SpecError(f"--folder {root}: no such folder")
    try:
        names = sorted(n for n in os.listdir(root) if not n.startswith("."))
    except OSError as exc:
        raise SpecError(f"--folder {root}: cannot list it ({exc.strerror or exc})") from exc
    classes = [n for n in names if os.path.isdir(os.path.join(root, n))]
    items: list[tuple[str, int]] = []
    if classes:
        for label, name in enumerate(classes):
            for folder, dirs, files in os.walk(os.path.join(root, name)):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                items.extend((os.path.join(folder, f), label)
                             for f in sorted(files) if not f.startswith("."))
    else:
        items = [(os.path.join(root, n), 0) for n in names
                 if os.path.isfile(os.path.join(root, n))]
    if not items:
        raise SpecError(f"--folder {root}: no sample files in it (expected DIR/CLASS/FILE or "
                        "files directly in DIR)")
    return items


class FolderDataset(Dataset[tuple[torch.Tensor, int]]):
    """The samples of a class-folder, each file read and decoded on every access."""

    def __init__(self, root: str, *, decode: str = "auto",
                 shape: tuple[int, ...] = (3, 64, 64)) -> None:
        if decode not in DECODERS:
            raise SpecError(f"--decode {decode!r}: choose one of {', '.join(DECODERS)}")
        if len(shape) != 3 or min(shape) < 1:
            raise SpecError(f"--shape {shape}: expected C,H,W, three positive numbers")
        self.root = root
        self.items = scan(root)
        self.shape = shape
        if decode == "auto":
            images = sum(os.path.splitext(p)[1].lower() in IMAGE_EXTENSIONS
                         for p, _ in self.items[:100])
            decode = "image" if images * 2 > min(len(self.items), 100) else "raw"
        if decode == "image":
            if shape[0] not in (1, 3):
                raise SpecError(f"--shape {shape}: image decode makes 1 (grey) or 3 (RGB) "
                                "channels")
            if importlib.util.find_spec("PIL") is None:
                raise SpecError("--decode image needs Pillow (pip install pillow); "
                                "--decode raw reads any file without it")
        self.decode = decode

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        with open(path, "rb") as fh:
            raw = fh.read()
        if self.decode == "image":
            return decode_image(raw, self.shape), label
        return decode_raw(raw, self.shape), label


def decode_raw(raw: bytes, shape: tuple[int, ...]) -> torch.Tensor:
    """The first C*H*W bytes as a C x H x W float tensor in [0, 1]."""
    need = math.prod(shape)
    buf = bytearray(raw[:need])
    if len(buf) < need:
        buf.extend(bytes(need - len(buf)))
    return torch.frombuffer(buf, dtype=torch.uint8).view(*shape).float().div_(255)


def decode_image(raw: bytes, shape: tuple[int, ...]) -> torch.Tensor:
    """An image file's bytes as a C x H x W float tensor in [0, 1], resized to H x W."""
    from PIL import Image  # noqa: PLC0415 - only the image decode needs Pillow

    channels, height, width = shape
    with Image.open(io.BytesIO(raw)) as img:
        pic = img.convert("RGB" if channels == 3 else "L").resize((width, height))
        buf = bytearray(pic.tobytes())
    return torch.frombuffer(buf, dtype=torch.uint8).view(height, width, channels) \
        .permute(2, 0, 1).float().div_(255)


def folder_source(root: str, decode: str, shape: tuple[int, ...]) -> Source:
    """The built-in dataset over a class-folder of files (``--folder DIR``)."""
    ds = FolderDataset(root, decode=decode, shape=shape)
    return Source(ds, f"folder {root} ({len(ds)} files, {ds.decode} decode to "
                      f"{'x'.join(map(str, shape))})", [p for p, _ in ds.items])
