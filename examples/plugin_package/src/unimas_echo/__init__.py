"""Example unimas plugin package (see docs/plugins.md)."""
