"""Checks of the deployment files under deploy/ and of the installable package: no servers."""
