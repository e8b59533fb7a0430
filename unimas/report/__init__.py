"""Run reports: plots and a self-contained HTML trajectory viewer."""
