"""Object storage (``s3://`` roots): the client, ranged reads of a store in a bucket, tree
copies, sealed segments shipped create-only, their restore and compaction, and one writer per
prefix fenced by lease epochs."""
