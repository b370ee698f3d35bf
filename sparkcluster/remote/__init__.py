"""Reaching the nodes: one SSH connection per host (its target resolved through ssh_config), opened to
all at once with strict host keys; one runner over SSH and one over `docker exec`, both failing loudly
with one `CommandResult`; the Docker API over that same connection; the cluster lock."""
