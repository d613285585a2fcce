"""Helpers of the end-to-end suite: cluster access, driver processes, waiting, expectations, reports."""
