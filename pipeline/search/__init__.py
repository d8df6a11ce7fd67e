"""Search spaces, method B's probability model, and the black-box search API.

``from pipeline.search import search, random_search, SearchSpace, Decision`` is the public entry
point for searching any categorical space (see :mod:`pipeline.search.blackbox`); ``Searcher`` is the
same method as ask/tell (:mod:`pipeline.search.asktell`).
"""

from pipeline.search.asktell import Searcher
from pipeline.search.blackbox import Evaluation, SearchResult, random_search, search
from pipeline.search.space import Arch, Decision, SearchSpace

__all__ = ["Arch", "Decision", "Evaluation", "SearchResult", "SearchSpace", "Searcher", "random_search", "search"]
