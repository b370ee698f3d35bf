"""The node side: what runs inside every sparkcluster container (standard library only)."""
