"""The network side of the pipeline: the broker and the subscribe / keys / broker commands."""
