"""Samples with named fields, read from a packer output of kind ``"fields"``.

Each sample is a run of one record per field (the manifest's ``options.fields``, in order); a
field the sample does not have is a record of no bytes with checksum 0 and reads as ``None``.
Only the fields asked for are read: ``fields=("txt",)`` moves the captions' bytes, never the
images'. A batch is one ``read_many`` over all its samples' chosen records.

``collate_fields`` batches what the dataset returns: images of one shape and numbers are
stacked into tensors, everything else (captions, JSON objects, box lists of varying length)
stays a list, so any ``DataLoader(num_workers=N)`` works under fork and spawn.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from packer.core.fields import ABSENT, FieldSpec
from packer.decode.audio import AudioOptions, check_audio_options
from packer.decode.values import decode_value
from packer.errors import InputFileError, PackerError
from packer.read.dataset_base import PackedSamples, SampleDataset
from packer.read.options import ReadOptions
from packer.read.store import Packed, opened
from packer.read.transport import bytes_column

__all__ = ["FieldDataset", "collate_fields"]

FieldTransforms = Callable[[Any], Any] | Mapping[str, Callable[[Any], Any]] | None


class FieldDataset(PackedSamples, SampleDataset):
    """A packer output of samples with fields (any format that holds them: LMDB, NPY, HDF5).

    Args:
        root: the output's folder or URL.
        fields: the field names to read, e.g. ``("jpg", "txt")``: each sample is then a tuple
            in that order, and only those fields' bytes are read. ``None`` (default): every
            field, each sample a dict of ``__key__`` and its fields.
        transform: a callable applied to the whole sample (the dict or tuple), or a mapping of
            field name to a callable applied to that field's value (a field absent in a
            sample is not passed). A fused crop (``{"jpg": RandomResizedCrop(224)}``) gets the
            field's stored bytes, whatever ``output`` is: it decodes only what it needs.
        output: how image fields are returned: ``"pil"``, ``"numpy"``, ``"tensor"``;
            ``"bytes"`` returns every field as its stored bytes (no decode, no parse).
        on_error: ``"raise"`` or ``"skip"`` (serve the next sound sample in place of one that
            does not decode; see :class:`~packer.read.dataset_base.SampleDataset`).
        decoder: the JPEG decoder for image fields (``"auto"``, ``"pillow"``, ...).

    The keyword-only options are the read options (:class:`~packer.read.options.ReadOptions`)
    and, for audio fields, ``sample_rate``, ``mono``, ``max_frames`` and ``crop``
    (:class:`~packer.decode.audio.AudioOptions`; an audio field reads as ``(waveform,
    sample_rate)``, numpy unless ``output="tensor"``).
    """

    UNIT = "samples"

    def __init__(
        self,
        root: str | os.PathLike[str] | Packed,
        fields: Sequence[str] | None = None,
        transform: FieldTransforms = None,
        output: str = "pil",
        on_error: str = "raise",
        decoder: str = "auto",
        *,
        split: str | None = None,
        readahead: bool | None = None,
        max_open_files: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache: bool | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        check_records: bool = False,
        sample_rate: int | None = None,
        mono: bool | None = None,
        max_frames: int | None = None,
        crop: str | None = None,
    ) -> None:
        self.audio = AudioOptions(sample_rate, mono, max_frames, crop)
        options = ReadOptions(
            split,
            readahead,
            max_open_files,
            storage_options,
            cache,
            cache_dir,
            cache_limit,
            check_records,
        )
        packed = opened(root, "fields", None, options)
        root = packed.given
        options = packed.options
        specs = list(packed.manifest.opts.fields)
        self.specs, self.key_place = _chosen(specs, fields, root)
        check_audio_options(self.audio, [s.kind for s in self.specs], root)
        self.as_tuple = fields is not None
        by_name = {s.name: j for j, s in enumerate(specs)}
        self.columns = np.array([by_name[s.name] for s in self.specs], dtype=np.int64)
        per_field = transform if isinstance(transform, Mapping) else {}
        unknown = sorted(set(per_field) - {s.name for s in self.specs})
        if unknown:
            raise PackerError(
                f"transform names field {unknown[0]!r}, which is not read; the fields read are "
                + ", ".join(s.name for s in self.specs)
            )
        self.field_transforms = dict(per_field)
        super().__init__(
            root,
            list(packed.manifest.classes),  # a class tree of clips, an HF ClassLabel's names
            packed.labels,
            None if isinstance(transform, Mapping) else transform,
            None,
            output,
            on_error,
            decoder,
        )
        self._attach(packed)
        self.checksums = packed.checksums
        if options.readahead is None and self._chosen_fraction() < 0.5:
            self.reader.read_exactly()  # a caption pass must not read the images beside them
        self._opened_by(
            FieldDataset,
            dict(
                root=root,
                fields=fields,
                transform=transform,
                output=output,
                on_error=on_error,
                decoder=decoder,
                sample_rate=sample_rate,
                mono=mono,
                max_frames=max_frames,
                crop=crop,
                **options.given(),
            ),
        )

    @property
    def fields(self) -> tuple[str, ...]:
        """The names of the fields read, in the order a sample gives them."""
        names = [s.name for s in self.specs]
        if self.key_place is not None:
            names.insert(self.key_place, KEY)
        return tuple(names)

    @property
    def categories(self) -> dict[int, str]:
        """A COCO source's categories, id to name (empty for other sources)."""
        return {c.id: c.name for c in self.manifest.opts.categories}

    def _chosen_fraction(self) -> float:
        """The chosen fields' share of the dataset's bytes."""
        if len(self.columns) == len(self.manifest.opts.fields):
            return 1.0
        total = int(self.reader.length.sum())
        return self.stored_bytes(range(len(self))) / total if total else 1.0

    def stored_bytes(self, indices: Sequence[int]) -> int:
        """Bytes the chosen fields' records of the samples occupy (what reading them moves)."""
        records = self._records(np.asarray(indices, dtype=np.int64))
        return int(self.reader.length[records].sum())

    def _records(self, positions: np.ndarray) -> np.ndarray:
        """The chosen fields' record numbers of samples ``positions``, sample by sample."""
        return (self.first[positions][:, None] + self.columns[None, :]).reshape(-1)

    def _read_batch(self, positions: np.ndarray) -> list[list[bytes | None]]:
        """Each sample's chosen fields' bytes (None: absent); records of no bytes not read."""
        records = self._records(positions)
        lengths = self.reader.length[records]
        stored = [None if d == ABSENT else b"" for d in self.checksums[records].tolist()]
        wanted = np.flatnonzero(lengths > 0)
        for j, data in zip(wanted.tolist(), self.reader.read_many(records[wanted])):
            stored[j] = data
        width = len(self.specs)
        if width == 0:  # only the key asked for
            return [[] for _ in positions.tolist()]
        return [stored[k : k + width] for k in range(0, len(stored), width)]

    def _finish(self, values: list[bytes | None], i: int) -> Any:
        out: dict[str, Any] = {}
        for spec, data in zip(self.specs, values):
            if data is None:
                out[spec.name] = None
                continue
            fn = self.field_transforms.get(spec.name)
            try:
                if fn is not None and getattr(fn, "takes_encoded", False):
                    value = fn(data)  # a fused crop: it decodes what it needs itself
                else:
                    value = decode_value(data, spec.kind, self.output, self.decoder, self.audio)
                    value = value if fn is None else fn(value)
            except InputFileError as exc:
                raise InputFileError(f"{self._describe(i)} field {spec.name!r} {exc}") from exc
            except (OSError, ValueError, SyntaxError) as exc:
                raise InputFileError(
                    f"{self._describe(i)} field {spec.name!r} cannot be decoded: {exc}"
                ) from exc
            out[spec.name] = value
        if self.as_tuple:
            values_out = list(out.values())
            if self.key_place is not None:
                values_out.insert(self.key_place, self.keys[i])
            item: Any = tuple(values_out)
        else:
            item = {KEY: self.keys[i], **out}
        return self.transform(item) if self.transform is not None else item

    def _item(self, values: list[bytes | None], i: int) -> Any:
        def again(j: int) -> Any:
            return self._finish(self._read_batch(np.array([j], dtype=np.int64))[0], j)

        return self._or_replacement(i, again, lambda: self._finish(values, i))

    def __getitem__(self, i: int) -> Any:
        position = self._position(i)
        return self._item(self._read_batch(np.array([position], dtype=np.int64))[0], position)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A whole batch: the chosen fields of every sample read in one pass, then decoded."""
        positions = self._position_array(indices)
        batch = self._read_batch(positions)
        return [self._item(v, i) for v, i in zip(batch, positions.tolist())]

    def _repr_fields(self) -> str:
        return "fields=" + ",".join(self.fields)


KEY = "__key__"  # a sample's key, asked for as a field


def _chosen(
    specs: list[FieldSpec], fields: Sequence[str] | None, root: str | os.PathLike[str]
) -> tuple[list[FieldSpec], int | None]:
    """The fields ``fields`` names, and where the key (``__key__``, told, never read) stands
    among them (None when it is not asked for)."""
    if fields is None:
        return list(specs), None
    if isinstance(fields, str):
        fields = (fields,)
    by_name = {s.name: s for s in specs}
    unknown = [f for f in fields if f not in by_name and f != KEY]
    if unknown or not fields or len(set(fields)) != len(fields):
        what = f"no field {unknown[0]!r}" if unknown else "a list of distinct field names"
        raise PackerError(
            f"{str(root)!r} has {what}; its fields are {', '.join(by_name) or '(none)'}"
        )
    place = list(fields).index(KEY) if KEY in fields else None
    return [by_name[f] for f in fields if f != KEY], place


def collate_fields(batch: Sequence[Any]) -> Any:
    """Collate samples of a :class:`FieldDataset`: per field (a dict's key, a tuple's place),
    tensors or arrays of one shape and numbers are stacked; anything else — strings, JSON
    values, ``None`` for an absent field, arrays of varying shape, images as PIL — stays a
    list. A list of ``bytes`` made in a DataLoader worker reaches the training process through
    reused shared memory instead of the pipe (:mod:`packer.read.transport`), still a list."""
    if not batch:
        return batch
    first = batch[0]
    if isinstance(first, Mapping):
        return {k: _column([s[k] for s in batch]) for k in first}
    if isinstance(first, tuple):
        return tuple(_column(list(column)) for column in zip(*batch))
    return _column(list(batch))


def _column(values: list[Any]) -> Any:
    if all(isinstance(v, torch.Tensor) for v in values):
        if len({tuple(v.shape) for v in values}) == 1:
            return torch.stack(values)
        return values
    if all(isinstance(v, np.ndarray) for v in values):
        if len({(v.shape, v.dtype) for v in values}) == 1 and values[0].dtype.kind in "biuf":
            return torch.from_numpy(np.stack(values))
        return values
    if all(type(v) is int for v in values):
        return torch.tensor(values, dtype=torch.int64)
    if all(type(v) is float for v in values):
        return torch.tensor(values, dtype=torch.float64)
    column = bytes_column(values)  # in a DataLoader worker: sent through reused shared memory
    return values if column is None else column
