"""Only for ``tests/preemption``, whose files another change owns: the signal tests and their process
helpers now live in :mod:`tests.faults.signals`. Delete this package once its imports name the new one."""
