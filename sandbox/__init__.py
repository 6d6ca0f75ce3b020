"""Try rtui's cloud targets without an account (``make sandbox-aws``, ``make sandbox-kube``)."""
