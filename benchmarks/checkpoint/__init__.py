"""Checkpoint save and load on a volume: blocking and async saves, staging, the local tier.

local (torch.save, stock DCP, ckptstore), async_save and async_scaling (dcp.async_save,
DefaultStager, the manager), restore_tier (node-local tier vs remote), rss_save, gpu_staging,
profile_local; async_common and interference are async_save's parts.
"""
