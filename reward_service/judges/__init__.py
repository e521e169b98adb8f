"""Generative judges: prompt templates (shared with the local ``judge:`` models) and remote OpenAI-compatible
judges. Torch-free, so the slim image serves remote judges too."""
