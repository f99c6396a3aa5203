"""One module per store, each with everything that store does: local disk (:mod:`.local`), and the
object stores S3, GCS and Azure (:mod:`.s3`, :mod:`.gcs`, :mod:`.azure`: the backend and its
adapter for :mod:`~flyte_checkpoint.storage.parallel`) on what they share through fsspec
(:mod:`.fsspec_store`). The object-store modules are imported on first use (see
:data:`~flyte_checkpoint.storage.options.STORES`), so a local-only program never imports fsspec.
"""
