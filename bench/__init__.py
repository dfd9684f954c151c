"""Benchmarks: speed figures printed next to baselines measured in the same run (`make bench`).

Tooling, apart from the request path: nothing in the product imports this package, and it names
no operator — the plan spec to measure is an argument, what to wait on and what "ready" means
come from that spec, and the sandbox (through its public API only) plays the operator. Each
module runs as `python -m bench.<name>`; those that need Django call `support.django_setup()`
themselves (a management command would put them in an app the request path loads).
"""
