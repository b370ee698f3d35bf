"""What each node's container is, on a floor of its own below every command.

`up` creates the containers from it, `checks` judge running containers against it, `fabric` makes
its throwaway containers from it and `deployment` ships files into them with it: all import it downward,
and it imports only `config`, `labels` and `node` (the agent's files and their contract), never
one command's package.
"""
