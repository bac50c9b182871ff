"""The read side: a packed dataset opened and checked (`store`), the torch datasets over it for
images and clips, samplers and mixtures, batches of raw bytes, `verify` and `inspect`'s text.

Nothing here imports the write side.
"""
