"""`sparkcluster up`: a plan made of steps, pure over inventory, profile and facts (printed by
`--dry-run`), the executor that walks those same steps, and the run with its lock, rollback and summary.
The stages themselves are `up/stages/`."""
