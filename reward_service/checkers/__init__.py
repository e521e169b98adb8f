"""Checkers: code that may take unbounded CPU or memory on hostile input, run in killable worker processes
under a per-sample deadline and a memory limit (``pool``, ``worker``): math-verify answer checking
(``worker.check_answer``, with ``options``), JSON-schema validation (``json_schema``) and reasoning-gym's
scoring (``reasoning_gym``). Settings: the ``checkers:`` block of the reward service config.

Below the rewards: the rewards submit jobs to the pool; nothing here imports a reward."""
