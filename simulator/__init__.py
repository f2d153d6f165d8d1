"""What Sibylla saves: trace-driven cluster simulation and reliability analytics.

The modules follow the data: ``jobs`` (the job record), ``philly`` and ``synthetic`` (where
jobs come from), ``cluster`` and ``scheduler`` (the replay), ``policies``, ``confusion`` and
``model_policy`` (what to do after a failure), ``metrics`` and ``plots`` (what it cost);
``reliability`` (failure rate, MTTF, the estimator the streaming worker feeds) and ``ettr``
(checkpointing under failures). ``cli`` registers ``sibylla simulate`` and
``sibylla reliability``; importing this package imports nothing else.
"""
