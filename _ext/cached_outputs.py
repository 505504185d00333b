"""Executed notebooks with their outputs also for pages taken from the execution cache.

myst-nb writes each page's notebook (``_build/jupyter_execute/<page>.ipynb``, which the page also
offers for download) from the notebook object it read. A page it executes itself gets its outputs
in that object; a page found in jupyter-cache gets them in a copy (``merge_match_into_notebook``),
so the written notebook has none. `make book` executes every page beforehand
(`scripts/execute_book.py`) and the build takes them all from the cache: without this, every
downloadable notebook would come out empty. The cached outputs are put back into the object the
parser writes.
"""

from myst_nb.core.execute.cache import NotebookClientCache

_start_client = NotebookClientCache.start_client


def start_client(self):
    read = self._notebook
    _start_client(self)
    if self._notebook is not read:  # a cache hit: the outputs are in the merged copy
        read.cells = self._notebook.cells
        self._notebook = read


def setup(app):
    NotebookClientCache.start_client = start_client
    return {"parallel_read_safe": True, "parallel_write_safe": True}
