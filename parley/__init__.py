"""Parley's surface for channel plugin authors: ``parley.testing`` (the contract kit).

The gateway itself lives in the top-level packages ``gateway``, ``channels``, ``agent`` and
``workspace``; a plugin registers its channel class under the ``parley.channels`` entry point
(``channels.base.ChannelPlugin``).
"""
