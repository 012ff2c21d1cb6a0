"""Bundled sample datasets (written for hallulog); see docs/tasks.md."""
