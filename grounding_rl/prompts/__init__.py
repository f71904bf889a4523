"""Prompts: the templates around a query, and (video, query) → the processor inputs every stage passes to the model."""
