"""`sparkcluster profile import`: the field's recipes (NVIDIA's local-ai-inference-recipes, eugr's
spark-vllm-docker, sparkrun's v1 and v2 registries, sparkring) read as sparkcluster profiles, and a
profile written back out as a sparkrun v2 recipe (`profile export --format sparkrun`).

`formats` detects and reads each source into one `Recipe`; `vllm_args` reads its `vllm serve`
command as vLLM's parser does; `build` makes the profile's TOML (and a performance record's data)
from it, naming every field that did not map with its line and why."""
