"""Inventory and profiles, validated before any connection: the image's name, the served vLLM's version
gates, the repositories a profile needs, the supervisor's bounds and the known-bad list. Pure
configuration: nothing here connects anywhere."""
