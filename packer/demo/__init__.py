"""Synthetic data sets: what ``packer demo`` converts and times, and the fixtures the tests and the
benchmarks build their trees from (photo-like images, frame trees and videos, caption sets, audio clips).

Modules here may import the read and write sides and the measurement helpers; no lower floor imports
them (only the lazy public names of :mod:`packer.video` and :mod:`packer.audio`, and ``packer demo``).
"""
