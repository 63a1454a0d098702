"""The optional compiled hot loops (rocketstore/storage/_hotloops.c); everything else is in pyproject.toml.

``optional=True``: on a machine without a C compiler (or Python headers) the build of the extension
fails quietly and the package installs with its pure-Python loops, which are the reference anyway
(see rocketstore/storage/_speedups.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("rocketstore.storage._hotloops", ["rocketstore/storage/_hotloops.c"], optional=True,
                             extra_compile_args=["-O2"])])
