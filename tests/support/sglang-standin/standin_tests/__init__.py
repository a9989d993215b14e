"""Tests of the SGLang stand-in (NOT SGLang). Run from the stand-in folder:
`python3 -m unittest`, or from the repository root:
`python3 -m unittest discover -s tests/support/sglang-standin`."""
