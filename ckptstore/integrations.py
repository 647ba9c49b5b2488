"""Gone: the framework plugins are their own distributions (``plugins/`` in the repository).

``import ckptstore.integrations.lightning`` (or ``.hf``) raises an ``ImportError`` that
names the package and the install command that replace it; docs/plugins.md has the rest.
"""

raise ImportError(
    "ckptstore.integrations is no longer part of ckptstore: the plugins are separate "
    "packages. Lightning: pip install 'ckptstore[lightning]', then "
    "'from ckptstore_lightning import CkptStoreIO'. Hugging Face: pip install "
    "'ckptstore[hf]', then 'from ckptstore_hf import CkptStoreCallback, CkptStoreAccelerate'",
    name="ckptstore.integrations",
)
