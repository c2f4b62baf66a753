"""Staging a model across the fleet (docs/staging.md): the manifest that names a model's bytes,
and the tree its copies take from host to host. Pure: the transfers run in agent/ and
coordinator/. Never imports shared.benchmark, shared.distributed, shared.cooling or
shared.reports."""
