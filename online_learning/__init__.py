"""Online learning: labels from the stream, gated fine-tunes, hot swap (docs/online_learning.md).

Modules, in the order of the data flow: ``votes`` (the majority rule, pure), ``worker`` (the
votes agents, ``POST /labels`` and the model watcher a worker registers), ``replay``,
``finetune``, ``gate``, ``store``, ``announce`` and ``trainer`` (the trainer, no Kafka),
``service`` (the trainer process), ``cli`` (``sibylla label|trainer|models``), ``settings`` and
``metrics``. Nothing is imported here, so ``sibylla --help`` never pays for torch or faust.
"""

__all__: list[str] = []
