"""Training and validation datasets for a run's ``[data]`` table.

Dataset kinds (:class:`~workbench.core.config.DataConfig`):

* ``factory``: ``package.module:function(**args)`` returns ``(train,
  validation)``, two torch Datasets whose items are ``(input, target)``;
* ``image-folder``: torchvision's ``ImageFolder`` layout (one folder per
  class), under ``path/train`` and ``path/val`` (or ``validation``, ``test``),
  or one folder whose images are split by ``val_fraction``;
* ``cifar10``: the ``cifar-10-batches-py`` folder under ``path`` as its
  authors distribute it (nothing is downloaded);
* ``hf-disk``: a Hugging Face ``datasets`` dataset saved with
  ``save_to_disk``, with its ``train`` and ``validation`` (or ``test``)
  splits, or one split divided by ``val_fraction``; ``columns`` names the
  input and target columns when they are not the usual ones.

Images are converted to float tensors, resized to ``image_size`` when it is
set and normalised to roughly zero mean. The built-in kinds have held-out
splits too (:func:`builtin_validation`): every fifth digit, the last 10% of
the byte corpus, and synthetic batches from seeds no training step uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

__all__ = ["load_datasets", "builtin_validation", "is_dataset"]

_VAL_NAMES = ("val", "validation", "valid", "test")


def is_dataset(obj: Any) -> bool:
    """A map-style dataset: indexable and sized."""
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")


def _split(dataset: Dataset, fraction: float, seed: int = 0) -> tuple[Dataset, Dataset]:
    """A fixed random ``1 - fraction`` / ``fraction`` split (the same on every rank and run)."""
    order = np.random.default_rng([seed, 7]).permutation(len(dataset))
    held = max(1, int(round(len(dataset) * fraction)))
    return Subset(dataset, order[held:].tolist()), Subset(dataset, order[:held].tolist())


def _image_transform(image_size: int) -> Callable:
    from torchvision import transforms

    steps = [transforms.Resize((image_size, image_size))] if image_size else []
    return transforms.Compose(steps + [transforms.ToTensor(), transforms.Normalize(0.5, 0.25)])


def _image_folder(path: Path, image_size: int, fraction: float) -> tuple[Dataset, Dataset]:
    from torchvision.datasets import ImageFolder

    transform = _image_transform(image_size)
    train_dir = path / "train"
    val_dir = next((path / n for n in _VAL_NAMES if (path / n).is_dir()), None)
    try:
        if train_dir.is_dir() and val_dir is not None:
            train, val = ImageFolder(str(train_dir), transform=transform), ImageFolder(str(val_dir), transform=transform)
            if train.classes != val.classes:
                raise ValueError(f"config field 'data.path' = {str(path)!r}: train/ has classes {train.classes}, "
                                 f"{val_dir.name}/ has {val.classes}")
            return train, val
        return _split(ImageFolder(str(path), transform=transform), fraction)
    except (FileNotFoundError, RuntimeError) as exc:
        raise ValueError(f"config field 'data.path' = {str(path)!r} is not an image folder (one sub-folder of "
                         f"images per class, or train/ and val/ of those): {exc}") from None


class _CifarBatches(Dataset):
    """CIFAR-10 in its distributed python format: pickled dicts of ``data`` [N, 3072] uint8 and ``labels``."""

    def __init__(self, files: list[Path], transform: Callable) -> None:
        import pickle

        images, labels = [], []
        for file in files:
            with open(file, "rb") as f:
                batch = pickle.load(f, encoding="latin1")
            images.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.extend(int(v) for v in batch.get("labels", batch.get("fine_labels", [])))
        self.images = np.concatenate(images).transpose(0, 2, 3, 1)  # [N, 32, 32, 3] as PIL expects
        self.labels = labels
        self.transform = transform
        if len(self.labels) != len(self.images):
            raise ValueError(f"{files[0].parent}: {len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        return self.transform(Image.fromarray(self.images[index])), self.labels[index]


def _cifar10(path: Path, image_size: int) -> tuple[Dataset, Dataset]:
    folder = path / "cifar-10-batches-py" if (path / "cifar-10-batches-py").is_dir() else path
    train = [folder / f"data_batch_{i}" for i in range(1, 6)]
    test = folder / "test_batch"
    missing = [f.name for f in train + [test] if not f.is_file()]
    if missing:
        raise ValueError(f"config field 'data.path' = {str(path)!r} holds no CIFAR-10 batches: {missing} are "
                         f"missing from {str(folder)!r} (the extracted cifar-10-python archive; nothing is "
                         "downloaded)")
    transform = _image_transform(image_size)
    try:
        return _CifarBatches(train, transform), _CifarBatches([test], transform)
    except (OSError, KeyError, ValueError, EOFError) as exc:
        raise ValueError(f"config field 'data.path' = {str(path)!r}: the CIFAR-10 batches do not read: "
                         f"{type(exc).__name__}: {exc}") from None


class _HFPairs(Dataset):
    """A Hugging Face dataset's rows as ``(input tensor, target tensor)`` pairs."""

    def __init__(self, rows: Any, columns: tuple[str, str], image_size: int) -> None:
        self.rows, self.columns = rows, columns
        self.transform = _image_transform(image_size)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.rows[int(index)]
        x, y = row[self.columns[0]], row[self.columns[1]]
        if hasattr(x, "convert"):  # a PIL image
            x = self.transform(x.convert("RGB"))
        return torch.as_tensor(x), torch.as_tensor(y)


def _hf_columns(names: list[str], columns: tuple[str, ...], path: Path) -> tuple[str, str]:
    if columns:
        missing = [c for c in columns if c not in names]
        if missing:
            raise ValueError(f"config field 'data.columns' = {list(columns)}: {missing} not among the columns "
                             f"{names} of {str(path)!r}")
        return columns[0], columns[1]
    source = next((c for c in ("image", "img", "pixel_values", "input_ids", "features", "x") if c in names), None)
    target = next((c for c in ("label", "labels", "target", "y") if c in names), None)
    if source is None or target is None:
        raise ValueError(f"config field 'data.columns' is needed for {str(path)!r}: its columns are {names}; "
                         "give [input, target]")
    return source, target


def _hf_disk(path: Path, columns: tuple[str, ...], image_size: int, fraction: float) -> tuple[Dataset, Dataset]:
    try:
        import datasets as hf
    except ImportError:
        raise ValueError("config field 'data.kind' = 'hf-disk' needs the 'datasets' package: "
                         "pip install datasets") from None
    try:
        loaded = hf.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise ValueError(f"config field 'data.path' = {str(path)!r} holds no dataset saved with "
                         f"save_to_disk: {exc}") from None
    if isinstance(loaded, hf.DatasetDict):
        if "train" not in loaded:
            raise ValueError(f"config field 'data.path' = {str(path)!r} has splits {list(loaded)}, none named train")
        train = loaded["train"]
        val_name = next((n for n in _VAL_NAMES if n in loaded), None)
        pair = _hf_columns(list(train.column_names), columns, path)
        if val_name is None:
            return _split(_HFPairs(train, pair, image_size), fraction)
        return _HFPairs(train, pair, image_size), _HFPairs(loaded[val_name], pair, image_size)
    pair = _hf_columns(list(loaded.column_names), columns, path)
    return _split(_HFPairs(loaded, pair, image_size), fraction)


def _from_factory(path: str, args: dict[str, Any]) -> tuple[Dataset, Dataset]:
    from .source import check_factory_args, load_factory

    factory = load_factory(path, "data.factory")
    check_factory_args(factory, args, "data.args", path)
    try:
        result = factory(**args)
    except Exception as exc:
        raise ValueError(f"config field 'data.factory' = {path!r}: the factory raised {type(exc).__name__}: "
                         f"{exc}") from exc
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and all(is_dataset(d) for d in result)):
        what = type(result).__name__ + (f" of {len(result)}" if isinstance(result, (tuple, list)) else "")
        raise ValueError(f"config field 'data.factory' = {path!r} returned a {what}; it must return "
                         "(train, validation): two torch Datasets of (input, target) items")
    train, val = result
    for name, dataset in (("train", train), ("validation", val)):
        if len(dataset) == 0:
            raise ValueError(f"config field 'data.factory' = {path!r}: its {name} dataset is empty")
        item = dataset[0]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"config field 'data.factory' = {path!r}: {name}[0] is a {type(item).__name__}; "
                             "items must be (input, target) pairs")
    return train, val


def load_datasets(data, *, seed: int = 0) -> tuple[Dataset, Dataset]:
    """``(train, validation)`` datasets of a dataset-kind ``DataConfig``; ValueError naming the field."""
    if data.kind == "factory":
        return _from_factory(data.factory, dict(data.args))
    path = Path(data.path).expanduser()
    if not path.is_dir():
        raise ValueError(f"config field 'data.path' = {data.path!r} is not a folder")
    if data.kind == "image-folder":
        return _image_folder(path, data.image_size, data.val_fraction)
    if data.kind == "cifar10":
        return _cifar10(path, data.image_size)
    if data.kind == "hf-disk":
        return _hf_disk(path, data.columns, data.image_size, data.val_fraction)
    raise ValueError(f"config field 'data.kind' = {data.kind!r} is not a dataset kind")


def builtin_validation(config, model, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Held-out batches of a built-in data kind (``config.evaluation.batches`` of them), never trained on."""
    from . import data as streams
    from .data import sample_batch

    kind, count = config.data.kind, config.evaluation.batches
    if kind == "synthetic":
        # training step s draws seed seed * 1_000_003 + s; these seeds are negative, so never the same
        for i in range(count):
            yield sample_batch(model, batch_size, seed=-(config.training.seed * 1_000_003 + i + 1))
        return
    if kind == "bytes-lm":
        batches = streams.bytes_lm_batches(batch_size, config.data.seq_len, seed=config.training.seed, train=False)
        for _ in range(count):
            yield next(batches)
        return
    shape = model.input_spec.shape if getattr(model, "input_spec", None) is not None else (3, 32, 32)
    flat = len(shape) == 1
    side = round(shape[0] ** 0.5) if flat else shape[-1]
    images, labels = streams.digits_dataset(image_size=side, channels=1 if flat else shape[0], train=False)
    dataset = TensorDataset(images.reshape(len(images), -1) if flat else images, labels)
    for start in range(0, min(len(dataset), count * batch_size), batch_size):
        x, y = dataset[start:start + batch_size]
        yield x, y
