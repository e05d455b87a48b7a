"""Strategy search: which mix of data, pipeline and tensor parallelism is fastest, and why.

The strategy space (``space``); the planner, which projects, simulates and ranks it (``search``),
and the typed question it is asked (``request``: ``Workload``, ``Budget``, ``SearchOptions``);
the fine-grained hybrid search around the per-layer programme, with the templates it is judged
against (``hybrid``: its results in ``hybrid_results``, stage timing in ``hybrid_stages``, partition
candidates in ``hybrid_partitions``). The top of the planning room: it may use ``layerwise``,
``costs`` and ``partitioning``, and none of them uses it.
"""
