"""vllm-guard: a self-healing supervisor for the vLLM OpenAI-compatible server.

The pure core (``diagnosis``, ``remedy``, ``plan``, ``lifecycle``, ``flags``) takes data and
returns decisions; the shell (``child``, ``health``, ``gpu``, ``status``, ``guard``, ``cli``)
does the I/O.
"""

__version__ = "0.1.0"
