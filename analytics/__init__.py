"""Spark analytics over kafkatap recordings: pure DataFrame transforms plus one job."""
