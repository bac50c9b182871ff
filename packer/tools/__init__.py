"""Diagnostics and measurement: what ``packer bench``, ``packer doctor`` and ``packer demo`` run.

Modules here may import packer's core modules; no core module imports them (except the lazy
command registration in :mod:`packer.cli.app` and the lazy public names of :mod:`packer`).
"""
