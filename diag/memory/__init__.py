"""Memory: OOM parsing, live breakdown, fake-tensor peak estimation and batch-size planning."""
