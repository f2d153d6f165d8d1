"""Tiny training settings and logs for the inference tests."""

from __future__ import annotations

from sibylla.inference.train import TrainConfig

TINY = TrainConfig(seed=7, dim=8, epochs=2, real_copies=1, min_count=2, synthetic=64)

OOM_LOG = """\
Epoch 3:  45%|####5     | 450/1000 [02:13<02:43,  3.37it/s, loss=0.512]
Traceback (most recent call last):
  File "/home/u/train.py", line 12, in <module>
    loss = model(x)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"""

NCCL_LOG = """\
[rank3]:[E ProcessGroupNCCL.cpp:563] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=48211, OpType=ALLREDUCE) ran for 1800092 milliseconds before timing out."""
