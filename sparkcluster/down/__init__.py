"""`sparkcluster down`: what it takes down, as steps (`down_plan`), and their walk (`down_run`)."""
