"""Search spaces, method B's probability model, and the black-box search API.

``from pipeline.search import search, random_search, SearchSpace, Decision`` is the public entry
point for searching any categorical space (see :mod:`pipeline.search.blackbox`).
"""

from pipeline.search.blackbox import Evaluation, SearchResult, random_search, search
from pipeline.search.space import Arch, Decision, SearchSpace

__all__ = ["Arch", "Decision", "Evaluation", "SearchResult", "SearchSpace", "random_search", "search"]
