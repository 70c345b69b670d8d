"""HTTP server of the built-in engine: OpenAI and TGI routes, /health, /metrics."""
