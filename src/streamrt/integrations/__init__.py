"""Integrations that run StreamRT inside other serving engines (Ray Serve); each imports its engine lazily."""
