"""``relay``: the admin command line (migrations, keys, workspaces, ``batch …``; ``dev``
runs :mod:`relay_batches.services.relay_dev` where it is installed)."""
