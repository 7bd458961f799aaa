"""The clients applications use: `Client` and `AsyncClient`, on pooled or borrowed connections."""
