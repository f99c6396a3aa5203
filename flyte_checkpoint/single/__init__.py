"""The single-object model: one checkpoint saved to, and loaded from, one object in a store.

Internal: the public names (``BaseCheckpoint``, ``Checkpoint``, ...) are re-exported by
:mod:`flyte_checkpoint`. The modules import one way, lowest first:

- :mod:`.transfer`: how one object is saved and loaded (imports nothing else here);
- :mod:`.workspace`: the restore workspace and the sweep of abandoned ones (imports nothing else here);
- :mod:`.saving` (a helper's saves, blocking or in the background), :mod:`.earlier_attempts`
  (resuming from, and cleaning up after, earlier attempts) and :mod:`.inspection` (what an object
  holds, for the command): each built on :mod:`.transfer`;
- :mod:`.checkpoint`: ``BaseCheckpoint`` and ``Checkpoint``, which join all of the above but
  :mod:`.inspection`.
"""
