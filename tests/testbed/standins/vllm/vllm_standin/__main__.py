"""`python3 -m vllm_standin ...` == `vllm ...` (test double of vLLM; see package docstring)."""

import sys

from vllm_standin.cli import main

sys.exit(main())
