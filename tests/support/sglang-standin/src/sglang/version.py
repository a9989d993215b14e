"""Version of the SGLang stand-in (NOT SGLang): "<imitated line>+standin"."""

from sglang._standin import version_string

__version__ = version_string()
