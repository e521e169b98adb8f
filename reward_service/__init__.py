"""GRPO reward service: built-in rewards, a code sandbox and PRM/ORM reward models behind gRPC."""
