"""cellhost's worker: runs cells for a cellhost host over protocol v1.

The host starts the interpreter with this package on ``sys.path`` and calls
:func:`cellhost_worker.main.run`. Nothing here is importable by cells except
the ``cellhost`` module it registers (see :mod:`cellhost_worker.api`).
"""
