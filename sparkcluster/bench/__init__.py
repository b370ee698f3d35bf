"""`sparkcluster bench`: throughput and latency of the serving cluster, measured by vLLM's own
`vllm bench serve` inside the head container, one concurrency level at a time.

The pure parts: `sweep` (the levels, the exact argv) and `results` (a level's output and JSON
turned into a row, the CSV, the run folder, the comparison with an earlier run, the chart); they
are unit-tested against output captured from a real `vllm bench serve`. The cluster side is
`runner` (the `Head` class: the only code here that talks to the head, over `ssh`/`fanout` and the
Docker API, so the one place to adapt when those change); `smoke` is `up --smoke`'s measurement.
Nothing is re-exported here: callers import the module a name lives in (`from sparkcluster.bench
import runner`), so each name has one home and importing one module does not load the rest.

Why inside the head container: the image already has `vllm bench`, the tokenizer is in the mounted
HF cache, and the requests do not cross the controller's network, which is not what is measured.
"""
