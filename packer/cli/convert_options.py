"""``packer convert``'s flags as one :class:`packer.write.options.ConvertOptions`: the command
parses, this builds the options once, the library checks them (the same object
:func:`packer.convert` builds from the same keywords)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packer.write.options import ConvertOptions

__all__ = ["convert_options"]

# the flags that name an option as it is named in the library
_SAME = (
    *("shard_size", "workers", "overwrite", "strict", "check", "resume", "kind"),
    *("max_file_size", "max_pixels", "allow_empty", "require", "image_column", "annotations"),
    *("follow_links", "quality", "max_side", "short_side", "reencode", "size", "fps"),
    "skip_bad_frames",
)


def convert_options(params: Mapping[str, Any]) -> ConvertOptions:
    """The options of ``packer convert`` given ``params`` (its parsed flags, by parameter name).

    Raises:
        PackerError: an option the library refuses; SourceError: a bad ``--labels`` or
            ``--classes`` file.
    """
    from packer.source.labels import labels_option, pinned_classes
    from packer.write.tasks import parse_part

    src, part = params["src"], params["part"]
    return ConvertOptions(
        **{name: params[name] for name in _SAME},
        format=params["fmt"],
        progress=not (params["quiet"] or params["as_json"]),
        split=list(params["splits"]) or None,
        labels=labels_option(params["labels_given"]),
        classes=pinned_classes(params["classes_file"], params["classes_from"]),
        part=parse_part(part) if part else None,
        source_options=params["storage_options"] if isinstance(src, str) else None,  # a URL's
    )
