"""Locus from Python.

``locus.Client`` is a connection to a Locus server (the Rust client underneath): file
operations, scripts and storelets. ``locus.filesystem.LocusFileSystem`` is an fsspec
filesystem for ``locus://HOST:PORT/path`` URLs, registered with fsspec by entry point,
so ``pandas.read_csv("locus://host:9610/data.csv")`` works as it is.

Credentials are found as the ``locus`` command finds them: ``LOCUS_TOKEN``
(``SUBJECT:TOKEN``), else ``~/.locus/credentials``. Failed calls raise ``OSError``
subclasses chosen by errno (``FileNotFoundError``, ``PermissionError``, ...).
"""

from ._locus import Client, Run

__all__ = ["Client", "Run"]
