"""The command line: one module per command (`<command>_cmd`), imported only when that command runs;
errors become one line and a fix in `main`. It composes the commands, which import none of one another
(monitoring's silence around `up` and `down`, `up` handed into `upgrade` and `rollback`)."""
