"""What a source tree holds, with no byte read: image class trees, video trees, labels files,
and the detection of a tree's kind and splits (where the sources of samples with fields go).
"""
