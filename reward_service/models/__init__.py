"""Process and outcome reward models and generative judges: loading, dynamic batching, hot swap
(``prm:<name>``, ``orm:<name>``, ``judge:<name>``).

Import from the submodules: this package must import without torch, so the slim image can read
``reward_service.models.settings``.
"""
