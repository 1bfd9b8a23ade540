"""``relay dev`` (``make run``): the local system, the upstream simulator and every service
as processes of this machine, under a supervisor.

Dev-only, like the simulator (``relay_batches.services.upstream_sim``): both are in the
source tree and its editable install (``make setup``), never in the wheel the image
installs (pyproject.toml lists them under ``[tool.relay] dev-packages``, not among the
packages), so a production install answers ``relay dev`` with a sentence saying so.
"""
