"""`sparkcluster status`, presented: the round trip that reads the cluster (`status`), the live view
(`live`, `status --watch`) and the fleet view (`fleet`). The cluster as a page to print is the web
console's (gateway/console_view, `/console/print`)."""
