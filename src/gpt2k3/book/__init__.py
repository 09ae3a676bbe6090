"""Code only the notebooks use: figures (static plotly), widgets (live ipywidgets), display
helpers (``show_source``, ``glue``, bounds), the benchmark results loader, the Colab bootstrap
and the Sphinx extension. The core never imports this package."""
