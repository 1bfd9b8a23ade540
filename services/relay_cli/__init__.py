"""``relay``: the admin command line (migrations, keys, the local dev supervisor)."""
