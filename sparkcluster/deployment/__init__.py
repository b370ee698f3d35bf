"""The deployment's domain, from the controller: the server handed to the supervisor (`server`), the
deployments found on the nodes (`deployments`), the endpoint (`endpoint`), the supervisor's bounds and
reports (`supervision`), teardown (`teardown`), the known-good record (`known_good`) and the canary kept
in it (`canary_watch`), compile caches (`compile_caches`), Ray membership (`ray_members`), the gateway's
registry (`gateway_registry`: where it runs, its config) and an upgrade's hold on it (`gateway_hold`). The
commands (`up`, `upgrade`, `gateway`, `monitor`, `bench`, `status`) stand on it; it names none of them."""
