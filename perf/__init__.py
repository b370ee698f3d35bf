"""`make bench`: sparkcluster's performance figures, measured on the two-host testbed."""
