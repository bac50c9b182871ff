"""The storage core's foundations: the manifest and its tables, keys, containment, locks, sizes.

Everything here reads or checks what a dataset folder holds; nothing here knows a format, a
source tree, an image or a URL. Every other sub-package may import it.
"""
