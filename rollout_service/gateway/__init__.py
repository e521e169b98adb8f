"""The OpenAI-compatible gateway: agents written against the OpenAI API call the policy over HTTP, and a
session records every call's exact tokens for training (``docs/agents.md``).

Layers as in the rest of the service: ``http_app`` (aiohttp routes, statuses) and ``openai_codec`` (OpenAI
JSON ↔ the domain types of ``types``) above ``service`` (one method per endpoint, generating through the
RolloutCore), ``sessions`` (the registry and its call records), ``conversation`` (prompts with the earlier
calls' ids reused) and ``trajectory`` (a session as training sequences).
"""
