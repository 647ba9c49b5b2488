"""The S3 store (``s3://``, ``s3a://``): ``S3Store`` and the modules it is made of.

==================  ==============================================================
``s3_store``        ``S3Store``: objects, listings, deletes, create-only writes
``client``          ``S3Client`` over s3fs's botocore client; ``make_s3fs``
``session``         this process's aiobotocore session, fork-safe spares for workers
``body``            request bodies: one part sent from several buffers, ETags
``multipart``       native multipart uploads and their call order
``server_copy``     server-side copy (``CopyObject`` / ``UploadPartCopy``)
``folders``         bulk deletes and folder keys
``error_map``       botocore / aiohttp failures -> ckptstore errors
==================  ==============================================================
"""

from __future__ import annotations

from ckptstore.stores.s3.s3_store import S3Store, make_s3fs

__all__ = ["S3Store", "make_s3fs"]
