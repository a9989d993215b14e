"""NOT SGLang: a stand-in that imitates SGLang's startup surface for tests.

See tests/support/sglang-standin/README.md in the provision repository.
"""

from sglang.version import __version__

__all__ = ["__version__"]
