"""Reclaimers: how a node that arrived for a rolled-back gang is given back."""
