"""packer's version, in a module that imports nothing, so any module can read it without a circle."""

__version__ = "0.2.0"
