"""The decisions, pure: vLLM's lines to a diagnosis (classifier), a failure to the next flags (remedy),
what fits (plan, memory), vLLM's per-version rules (vllm), and the session that decides every step of
the loop. No I/O, no clock, no randomness of their own: data in, decisions out."""
