"""`python -m sparkcluster`: the same command as `sparkcluster`."""

from sparkcluster.cli.main import run

run()
