"""Parallel transfers to object stores: N upload parts or N ranged reads in flight at once.

Store-agnostic. A store adapter (``S3Object`` in :mod:`flyte_checkpoint.storage.stores.s3`, say)
supplies a few coroutines through :class:`~.contract.UploadTarget` and
:class:`~.contract.RangeSource`; the writer and reader run them on the store client's own
event loop (fsspec's loop thread for s3fs, gcsfs and adlfs) with
``asyncio.run_coroutine_threadsafe``, so the caller's thread only copies bytes and blocks when
the pool is full.

Memory is a function of the settings, not of the object: an upload holds at most
``max_concurrency + 1`` buffers of ``part_size`` (up to ``max_concurrency`` in flight and one
being filled), a download ``max_concurrency`` (see :func:`~.sizing.transfer_memory`). Buffers are
allocated once per transfer and reused; parts go out as memoryviews of them. A regular file is
uploaded without part buffers: each part is read from the file as it is sent, so its
``file_concurrency`` parts in flight cost one read chunk each (:meth:`~.writer.ParallelWriter.write_from`).

Atomicity: an upload becomes visible only when the store completes it (S3:
CompleteMultipartUpload, or the single PutObject of an object smaller than one part), which
happens in :meth:`~.writer.ParallelWriter.commit` after every part succeeded. Any failure, abort or
``KeyboardInterrupt`` cancels the parts in flight and aborts the upload; the previous object
stays. An upload started by a request whose answer was lost is aborted too
(:meth:`~.writer.ParallelWriter._discard_strays`). A download is pinned to the version its first
response described: a replacement that lands meanwhile fails the load
(:class:`~.contract.ObjectReplacedError`) instead of mixing versions.

One module per concern: :mod:`.sizing` (part sizes, memory), :mod:`.bodies` (parts as file-like
bodies), :mod:`.contract` (what a store adapter supplies), :mod:`.retries` (one request's
retries), :mod:`.writer` and :mod:`.reader`. Import from them; this package re-exports nothing.
"""
