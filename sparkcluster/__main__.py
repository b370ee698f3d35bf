from sparkcluster.cli.main import run

run()
