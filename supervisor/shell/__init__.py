"""The thin shell around the core: the child process and one launch's watch, probes, the status server,
the state dir, processes and orphans, metrics, history, the webhook, and the guard that drives them."""
