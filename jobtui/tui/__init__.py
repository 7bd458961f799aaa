"""The operator console (Textual); imported only by `jobtui` with no command."""
