"""The Colab bootstrap: the first code cell of every notebook.

In Colab the book's package is not installed; the cell installs it from the
book's repository (``REPO_URL``, the same address as ``repository.url`` in
``_config.yml``; a test keeps the two and every notebook in step).  Anywhere else
the cell does nothing.
"""

REPO_URL = "https://github.com/gpt2k3/gpt2-to-kimi-k3"

BOOTSTRAP = f'''\
# Colab bootstrap: in Colab, install this book's package; anywhere else, do nothing.
import importlib.util, subprocess, sys
if "google.colab" in sys.modules and importlib.util.find_spec("gpt2k3") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "gpt2k3 @ git+{REPO_URL}"], check=True)'''

__all__ = ["REPO_URL", "BOOTSTRAP"]
