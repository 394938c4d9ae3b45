"""Foundations every layer shares: the params (config), logging, CPU-time accounting."""
