"""Pure DataFrame -> DataFrame transforms, one module per subject.

No transform reads or writes files or collects to the driver: the job
(`analytics/job.py`) owns I/O, so every transform runs the same on a laptop,
on a cluster, and in a unit test on a five-row DataFrame.
"""
