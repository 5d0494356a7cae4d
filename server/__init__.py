"""The cowrite server: document-session WebSockets and the server-side agent loop."""
