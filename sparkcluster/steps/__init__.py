"""The step engine shared by `up`, `upgrade` and the gateway: a `Step` (data plus the function that
performs it) and a `Stage` (`base`), and the walk that runs a list of steps against a `Run`, with the
progress the user sees and one `step` event per step (`walk`). It names no command."""
