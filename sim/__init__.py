"""A simulated GPU cluster for the demo and the tests: pure Python processes, no GPU needed.

- :mod:`sim.dcgm_exporter`: a dcgm-exporter look-alike (same metric names, types and labels) for N nodes
  of M GPUs each.
- :mod:`sim.trainer`: a "training job" that steps, checkpoints, resumes and exports the training metrics.
- :mod:`sim.faults` / :mod:`sim.cli`: fault injection (Xid, ECC, NVLink, thermal, vanished GPU; hang,
  slowdown, NCCL/OOM/IO/S3 errors, NaN loss, corrupt checkpoint).
- :mod:`sim.checkpoints`: the checkpoint layout (``step_000123/`` with a sha256 manifest).
- :mod:`sim.cluster`: the command lines that start those processes.

The processes share nothing but a state directory (:mod:`sim.statedir`), so faults survive restarts and any
process may be killed and started again, as on a real cluster.
"""
