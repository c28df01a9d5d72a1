"""sapiens2-stream-client: receive and decode a sapiens2-stream pipeline's messages without torch.

The wire format (docs/WIRE.md) has one implementation, here; the pipeline imports it.
"""
