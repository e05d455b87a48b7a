"""Per-layer search: every layer of a pipeline stage gets its own strategy, by dynamic programming.

Galvatron's decision trees of layer strategies (``layer_strategies``); each layer's cost under each
strategy on a stage (``layer_costs``); the programmes over the layers under a memory budget
(``layer_dp``) and the stage search that runs them (``stage_search``); per-layer recomputation of
pipelines that miss the memory cap (``finegrained``). Above ``costs`` and ``partitioning``, below
``strategy``.
"""
