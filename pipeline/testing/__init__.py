"""Test doubles and test infrastructure that ship with Epochal (Bytewax / Quix Streams style).

Modules:
    doubles      FakeClock, FlakyFileIO (failing operations on any FileIO), FailingSink (a sink that
                 refuses a commit), AbortingSource (a source read that aborts)
    moto_server  moto S3 server on loopback: in-process (:func:`moto_s3`), as a child process
                 (:func:`spawn_moto_server`, ``python -m pipeline.testing.moto_server``).

Importing this package is cheap: nothing heavy (moto, boto3) is imported until used.
"""
from __future__ import annotations

__all__: list[str] = []
