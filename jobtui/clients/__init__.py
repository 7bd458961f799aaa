"""The clients applications use: `Queue` and `AsyncQueue`, on pooled or borrowed connections."""
