"""Autograd-aware collectives (``pathweave.nn.functional``), as ``torch.distributed.nn``."""

from pathweave.nn import functional

__all__ = ["functional"]
