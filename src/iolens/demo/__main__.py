"""Demo training: an image-folder-like dataset of small files, a small CNN, CPU only.

    iolens run -- python -m iolens.demo            # what `make demo` runs
    python -m iolens.demo --files 4000 --workers 4 --epochs 2 --data /mnt/slow/demo

The dataset is generated once (class subfolders of 64 KiB sample files) and
read back every epoch through a DataLoader, decoding each file's bytes into
a 3x64x64 tensor, as an image pipeline would.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def make_dataset(root: str, files: int, size: int, classes: int = 4) -> None:
    """Write ``files`` sample files of ``size`` bytes into ``classes`` subfolders (once)."""
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        return
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class{c}"), exist_ok=True)
    for i in range(files):
        path = os.path.join(root, f"class{i % classes}", f"{i:06d}.bin")
        with open(path, "wb") as fh:
            fh.write(os.urandom(size))
    with open(marker, "w") as fh:
        fh.write(f"{files} {size}\n")


def main(argv: list[str] | None = None) -> int:
    import torch  # noqa: PLC0415 - the demo's own dependency, not iolens'
    from torch.utils.data import DataLoader, Dataset  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m iolens.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="dataset folder (default: a folder under the temp dir)")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--file-kib", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args(argv)
    data = args.data or os.path.join(tempfile.gettempdir(), "iolens-demo-data")
    size = args.file_kib * 1024
    t = time.monotonic()
    make_dataset(data, args.files, size)
    print(f"demo: dataset {data}: {args.files} files of {args.file_kib} KiB "
          f"(ready in {time.monotonic() - t:.1f} s)", flush=True)

    class Files(Dataset[tuple[torch.Tensor, int]]):
        def __init__(self, root: str) -> None:
            self.items = sorted(
                (os.path.join(root, c, f), int(c[5:]))
                for c in os.listdir(root) if c.startswith("class")
                for f in os.listdir(os.path.join(root, c)))

        def __len__(self) -> int:
            return len(self.items)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            path, label = self.items[i]
            with open(path, "rb") as fh:
                raw = fh.read()
            pixels = torch.frombuffer(bytearray(raw[: 3 * 64 * 64]), dtype=torch.uint8)
            return pixels.view(3, 64, 64).float().div_(255), label

    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(Files(data), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(), torch.nn.Linear(128, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        t = time.monotonic()
        seen = 0
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            seen += len(y)
        dt = time.monotonic() - t
        print(f"demo: epoch {epoch + 1}/{args.epochs}: {seen} samples in {dt:.1f} s "
              f"({seen / dt:.0f} samples/s), loss {loss.item():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
