"""Monitoring (issue 37): Prometheus and Alertmanager on the head, node_exporter on every node, each
a container of a pinned release (`[monitor]` in the inventory), scraping what sparkcluster already
serves: each node agent's `/metrics` (node/metrics), every deployment's vLLM `/metrics`, node_exporter
and the gateway where one runs. The alert rules (rules/) and the Grafana dashboards (dashboards/)
ship with the package; `sparkcluster monitor up|down` (cli/monitor_cmd) starts and stops the stack.

Modules: `scrape` (prometheus.yml from the inventory and the running deployments), `alerting`
(alertmanager.yml: the owner's webhook, the grouping; silences), `stack` (the containers),
`planned` (what `up` and `down` do to monitoring: silences, new targets), `dashboards` (Grafana's)."""
