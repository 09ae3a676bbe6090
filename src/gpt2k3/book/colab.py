"""The book's address and version, and the Colab bootstrap: the first code cell of every notebook.

One place for both: :data:`REPO_URL` here and the package version, ``gpt2k3.__version__``
(which ``pyproject.toml`` reads).  ``scripts/sync_bootstrap.py`` writes them everywhere else
they appear -- the first cell of every notebook (:data:`BOOTSTRAP`), ``_config.yml``'s
repository and launch-button settings, and the README's Colab and install lines -- and
``tests/test_bootstrap.py`` fails while any of those disagrees.

In Colab the book's package is not installed; the cell installs it with one pip command from
the book's repository at the tag of this version (:data:`TAG`), never a moving branch, so a
notebook always gets the code it was written with, and says what that command installs: the
package -- the book's code and the benchmark results the chapters plot -- and whichever of its
dependencies (:data:`REQUIREMENTS`, equal to ``pyproject.toml``'s) the runtime lacks or has
older.  Colab's published package list (``tests/data/colab_pip_freeze.txt``) already satisfies
every one, so there pip installs the package alone and upgrades nothing Colab's front end
relies on.  Anywhere else the cell does nothing.

The optional independent checks (``transformers``, ``fla-core``) are the ``oracles`` extra,
never installed by the cell: see :mod:`gpt2k3.oracles`.
"""

from gpt2k3 import __version__ as VERSION

#: The book's repository (the one configured address).
REPO_URL = "https://github.com/gpt2k3/gpt2-to-kimi-k3"
#: The git tag of this version: what the bootstrap installs and the launch buttons open.
TAG = f"v{VERSION}"
#: The package as pip installs it from the repository at :data:`TAG`.
PIP_TARGET = f"gpt2k3 @ git+{REPO_URL}@{TAG}"

#: The package's dependencies, as ``pyproject.toml`` declares them.  Lower bounds that Colab's
#: runtime meets as it is: its ipywidgets is 7.7.1, and its front end does not support 8.
REQUIREMENTS = ("torch>=2.1", "numpy>=1.24", "plotly>=5.20", "ipywidgets>=7.7", "matplotlib>=3.7",
                "nbformat>=4.2")

COLAB_URL = "https://colab.research.google.com"


def colab_notebook_url(notebook: str) -> str:
    """Where Colab opens ``notebook`` (a file name in ``notebooks/``) of this version."""
    if not isinstance(notebook, str) or not notebook.endswith(".ipynb") or "/" in notebook:
        raise ValueError(f"notebook must be a notebook file name such as '01_gpt2.ipynb', got {notebook!r}")
    owner_repo = REPO_URL.removeprefix("https://github.com/")
    return f"{COLAB_URL}/github/{owner_repo}/blob/{TAG}/notebooks/{notebook}"


BOOTSTRAP = f'''\
# Colab bootstrap: in Colab, install this book's package ({TAG}); anywhere else, do nothing.
import importlib.util, subprocess, sys
if "google.colab" in sys.modules and importlib.util.find_spec("gpt2k3") is None:
    print("Installing gpt2k3 {VERSION} from {REPO_URL} (tag {TAG}): this book's code and "
          "benchmark results, and whichever of {", ".join(REQUIREMENTS)} this runtime lacks "
          "or has older")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "{PIP_TARGET}"], check=True)'''

__all__ = ["REPO_URL", "VERSION", "TAG", "PIP_TARGET", "REQUIREMENTS", "COLAB_URL", "colab_notebook_url",
           "BOOTSTRAP"]
