"""Optional integrations, each behind its own extra and imported only when you import it.

- :mod:`flyte_checkpoint.integrations.flyte` (extra ``flyte``): ``flyte.ctx().checkpoint`` inside
  a Flyte task returns a :class:`flyte_checkpoint.Checkpoint` once ``install()`` has run.
- :mod:`flyte_checkpoint.integrations.lightning` (extra ``lightning``): a ``ModelCheckpoint`` that
  mirrors its directory to a checkpoint, and a resume helper.
- :mod:`flyte_checkpoint.integrations.transformers` (extra ``transformers``): a ``TrainerCallback``
  that saves the output directory after each save, and a resume helper.

This package imports none of them, so ``import flyte_checkpoint`` never pulls in a framework.
"""
