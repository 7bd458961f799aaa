"""The `jobtui` command: `main.py` dispatches, and each command group owns its module."""
