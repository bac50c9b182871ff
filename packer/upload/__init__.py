"""A dataset written to a URL: staged locally, streamed shard by shard while the conversion runs,
journaled so `--resume` trusts only what the store still holds, and published in reader-safe order.
"""
