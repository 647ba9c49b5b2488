"""A torchtitan config registry, as a user writes one: torchtitan's llama3 debug model,
checkpointed through ckptstore (the two lines under the function's first). The folder
comes from the environment (CKPTSTORE_TITAN_FOLDER), so the test picks it."""

import os

from ckptstore_titan import CkptStoreCheckpointManager
from torchtitan.models.llama3.config_registry import llama3_debugmodel


def llama3_debugmodel_ckptstore():
    config = llama3_debugmodel()
    config.checkpoint = CkptStoreCheckpointManager.Config.from_titan(
        config.checkpoint,
        enable=True,
        folder=os.environ["CKPTSTORE_TITAN_FOLDER"],
        interval=2,
        async_mode="async",
    )
    return config
