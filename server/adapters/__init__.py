"""Frontend interop: HTTP tool results, the Vercel AI SDK and AG-UI (PROTOCOL.md section 16).

Every adapter is a translation: it attaches a `link.RunLink` to the document
session, starts or answers ordinary runs through it, and maps cowrite events
to the other protocol. No run logic lives here.
"""
