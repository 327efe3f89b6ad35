"""Benchmarks for Parley (``make bench`` / ``python -m bench``), never part of ``make test``.

The real gateway runs as a subprocess (``parley gateway`` with a config as ``parley onboard``
writes it), talks to a scripted OpenAI-compatible server in a second helper process (directly, as
``agent.transport: auto`` does for ``openai/<name>`` at an ``api_base``; through litellm with
``--transport litellm``), and is driven over the local channel's HTTP API from this process:
client, model server and gateway never share a GIL. Context building is measured in-process.
"""

MODEL = "openai/bench-model"
"""Unknown to litellm's model map: the context window falls back to the gateway's default."""
