"""The channel contract kit: the same black-box checks on any channel, given a fake of its
platform (``PlatformFake``). See ``contract.py``."""

from parley.testing.contract import CHECKS, ChannelContract, ContractFailure, PlatformFake

__all__ = ["CHECKS", "ChannelContract", "ContractFailure", "PlatformFake"]
