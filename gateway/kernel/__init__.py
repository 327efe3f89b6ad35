"""The kernel: what every layer shares, importing nothing else of ours.

Bus events and the bus, the store, the config, the clock, schedules, pairing codes, the jobs
table, the backoff policy, and the value types channels and the agent exchange (channel hints,
delivery results, command descriptions). ``tests/test_layers.py`` keeps it a leaf.
"""
