"""The fabric, measured (issue #26): what NCCL chose and how fast the collectives ran.

`nccl_log` reads NCCL's INFO output and the probe's result lines (pure); `judge` turns them and the
inventory's expectations into results (pure). The rank program itself is
`sparkcluster/node/fabric_probe.py`, shipped into the containers as a plain file.
"""
