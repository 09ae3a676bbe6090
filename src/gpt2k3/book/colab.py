"""The Colab bootstrap: the first code cell of every notebook.

In Colab the book's package is not installed; the cell installs it from the
book's repository (``REPO_URL``, the same address as ``repository.url`` in
``_config.yml``; a test keeps the two and every notebook in step) with one pip
command, and says what that command installs: the package -- the book's code and the
benchmark results the chapters plot -- and whichever of its dependencies
(``REQUIREMENTS``, equal to ``pyproject.toml``'s; a test keeps them in step) the
runtime lacks.  Anywhere else the cell does nothing.

The optional independent checks (``transformers``, ``fla-core``) are the
``oracles`` extra, never installed by the cell: see :mod:`gpt2k3.oracles`.
"""

REPO_URL = "https://github.com/gpt2k3/gpt2-to-kimi-k3"

#: The package's dependencies, as ``pyproject.toml`` declares them.
REQUIREMENTS = ("torch>=2.1", "numpy>=1.24", "plotly>=5.20", "ipywidgets>=8", "matplotlib>=3.7",
                "nbformat>=4.2")

BOOTSTRAP = f'''\
# Colab bootstrap: in Colab, install this book's package; anywhere else, do nothing.
import importlib.util, subprocess, sys
if "google.colab" in sys.modules and importlib.util.find_spec("gpt2k3") is None:
    print("Installing gpt2k3 from {REPO_URL}: this book's code and benchmark results, "
          "and whichever of {", ".join(REQUIREMENTS)} this runtime lacks or has too old")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "gpt2k3 @ git+{REPO_URL}"], check=True)'''

__all__ = ["REPO_URL", "REQUIREMENTS", "BOOTSTRAP"]
