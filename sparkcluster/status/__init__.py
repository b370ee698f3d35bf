"""`sparkcluster status`, presented: the round trip that reads the cluster (`status`), the live view
(`live`, `status --watch`), the HTML report (`html_report`, `status --html`) and the fleet view
(`fleet`)."""
