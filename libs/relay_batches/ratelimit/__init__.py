"""Shared per-deployment rate limits: the leader's grants, each worker's budget, AIMD."""
