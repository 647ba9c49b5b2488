"""Checkpoints on an object store (SeaweedFS started by the benchmark, direct or shaped link).

save_load (raw ceiling, FsspecWriter, s3torchconnector, ckptstore; contenders.py holds what
each one does, summary.py its tables), torchsave_s3 (rank-0 torch.save + upload, a suite
scenario), profile_s3.
"""
