"""`sparkcluster down`: what it takes down, as steps (`plan`), and their walk (`execute`)."""
